#!/usr/bin/env python3
"""Decode speed of `corelm serve` with requests of mixed lengths in one batch: a long prompt
(deep in the context, where attention dominates a decode step) and short ones that decode beside
it. Reports each request's TPOT (mean gap between streamed tokens after the first), for one or
more corelm binaries run in turn for --rounds rounds (the shared VMs drift between runs, so
compare the same round's rows).

Usage:
  python3 scripts/serve_mixed.py --bin base=/tmp/base/target/release/corelm \\
      --bin new=target/release/corelm [--long 3500] [--short 40] [--shorts 1] [--tokens 96] \\
      [--threads 2] [--rounds 3] [--serve-args=--no-batch-invariant]

Only the standard library: http.client, threads.
"""

import argparse
import http.client
import json
import os
import shlex
import socket
import statistics
import subprocess
import threading
import time
from pathlib import Path

WORDS = ("the river ran past the old mill and the miller counted every sack of grain twice before "
         "he wrote the numbers in a book that his father had kept for forty years").split()


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def prompt_of(n_words):
    return " ".join(WORDS[i % len(WORDS)] for i in range(n_words))


def stream(port, prompt, max_tokens, out, start_evt=None):
    """One streaming completion; appends (first token time, token times) to `out`."""
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=600)
    body = json.dumps({"prompt": prompt, "max_tokens": max_tokens, "temperature": 0, "stream": True,
                       "ignore_eos": True})
    t0 = time.perf_counter()
    conn.request("POST", "/v1/completions", body, {"Content-Type": "application/json"})
    resp = conn.getresponse()
    times = []
    for raw in resp:
        line = raw.decode().strip()
        if not line.startswith("data:") or line == "data: [DONE]":
            continue
        times.append(time.perf_counter())
        if start_evt is not None and len(times) == 1:
            start_evt.set()
    conn.close()
    if start_evt is not None:
        start_evt.set()
    if resp.status != 200 or not times:
        raise SystemExit(f"the server answered {resp.status} with no tokens")
    out.append((t0, times))


def run_once(binary, model, args):
    port = free_port()
    cmd = [binary, "serve", "-m", model, "--port", str(port), "-t", str(args.threads),
           "-c", str(2 * args.long + args.tokens + 64), "--parallel", str(1 + args.shorts)] + shlex.split(args.serve_args)
    srv = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        for _ in range(600):
            try:
                c = http.client.HTTPConnection("127.0.0.1", port, timeout=1)
                c.request("GET", "/health")
                if c.getresponse().status == 200:
                    break
            except OSError:
                time.sleep(0.1)
        else:
            raise SystemExit(f"{binary} serve did not answer /health in 600 tries (exit status {srv.poll()})")
        long_out, short_out = [], []
        started = threading.Event()
        # Words ≈ tokens for this word list (one token each, plus BOS).
        lt = threading.Thread(target=stream, args=(port, prompt_of(args.long), args.tokens, long_out, started))
        lt.start()
        started.wait(600)
        shorts = [threading.Thread(target=stream, args=(port, prompt_of(args.short), args.tokens, short_out)) for _ in range(args.shorts)]
        for t in shorts:
            t.start()
        for t in shorts + [lt]:
            t.join()
        # The long request's gaps while the short ones decoded beside it, and the short ones'.
        s_first = min(times[0] for _, times in short_out)
        s_last = max(times[-1] for _, times in short_out)
        lt_times = long_out[0][1]
        beside = [b - a for a, b in zip(lt_times, lt_times[1:]) if a >= s_first and b <= s_last]
        short_gaps = [b - a for _, times in short_out for a, b in zip(times, times[1:])]
        return statistics.mean(beside) * 1e3 if beside else float("nan"), statistics.mean(short_gaps) * 1e3
    finally:
        srv.terminate()
        srv.wait()


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--bin", action="append", required=True, help="name=path of a corelm binary")
    ap.add_argument("--model", default=str(Path(os.environ.get("CORELM_MODELS", "~/.cache/corelm/models")).expanduser() / "SmolLM2-135M-Instruct.Q4_1.gguf"))
    ap.add_argument("--long", type=int, default=3500, help="words (≈ tokens) of the long prompt")
    ap.add_argument("--short", type=int, default=40, help="words of each short prompt")
    ap.add_argument("--shorts", type=int, default=1, help="short requests beside the long one")
    ap.add_argument("--tokens", type=int, default=96, help="tokens each request generates")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--serve-args", default="")
    args = ap.parse_args()
    bins = [b.split("=", 1) for b in args.bin]
    print("| round | binary | long request's TPOT beside the short ones, ms | short requests' TPOT, ms |")
    print("|---|---|---|---|")
    for rnd in range(args.rounds):
        for name, path in bins:
            lt, st = run_once(path, args.model, args)
            print(f"| {rnd + 1} | {name} | {lt:.2f} | {st:.2f} |", flush=True)


if __name__ == "__main__":
    main()
