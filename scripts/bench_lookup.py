#!/usr/bin/env python3
"""Prompt-lookup decoding (`serve --lookup N`) against plain decoding: the same greedy
completions (raw prompts, no chat template), one at a time, on two servers started here in
turn (each alone on the machine); decode tokens/s per prompt (first streamed token to last),
whether the answers are equal, and the drafts kept (`/metrics`). With `--llama-lookup`,
llama.cpp's own `llama-lookup` (its n-gram lookup decoding, built from the pinned sdist) on
the same prompts, with drafts of 0 (plain decoding) and N tokens, in the same rounds.

    scripts/bench_lookup.py [--model M.gguf] [--lookup 6] [--tokens 200] [--rounds 3] \
        [--llama-lookup /work/llama/b-avx512/bin/llama-lookup]
"""
import argparse
import json
import os
import re
import socket
import subprocess
import tempfile
import time
import urllib.request

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CODE = open(os.path.join(ROOT, "crates/engine/src/lookup.rs")).read()[:1800]
PROMPTS = {
    # The answer copies the prompt: the case drafts are for.
    "edit code": f"Here is a Rust file:\n```rust\n{CODE}\n```\nThe same file with the doc comments removed, nothing else changed:\n```rust\n",
    "repeat list": "Fruit: apple, pear, plum, fig, kiwi, lime, date, peach.\nThe list again, one fruit per line, three times:\n",
    # Prose that does not repeat its prompt: drafts mostly rejected.
    "story": "Here is a short story about a lighthouse keeper who finds a message in a bottle.\n\n",
}


def post(port, path, body):
    req = urllib.request.Request(f"http://127.0.0.1:{port}{path}", data=json.dumps(body).encode(), headers={"content-type": "application/json"})
    return json.load(urllib.request.urlopen(req, timeout=600))


def metric(port, name):
    text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics").read().decode()
    return next(float(l.split()[-1]) for l in text.splitlines() if l.startswith(name + " "))


def serve(model, lookup, threads):
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    args = [os.path.join(ROOT, "target/release/corelm"), "serve", "--port", str(port), "--ctx-size", "2048", "--parallel", "1", "--lookup", str(lookup), "-t", str(threads)]
    if model:
        args += ["-m", model]
    p = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    for _ in range(600):
        try:
            urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=1)
            return p, port
        except Exception:
            time.sleep(0.1)
    p.kill()
    raise SystemExit("server did not start")


def run(port, prompt, tokens):
    """The answer, and its decode rate: tokens after the first over the time from the first
    streamed chunk to the last (the prompt's prefill left out)."""
    body = {"prompt": prompt, "max_tokens": tokens, "temperature": 0,
            "ignore_eos": True, "stream": True, "stream_options": {"include_usage": True}}
    req = urllib.request.Request(f"http://127.0.0.1:{port}/v1/completions", data=json.dumps(body).encode(), headers={"content-type": "application/json"})
    text, first, last, n = "", None, None, 0
    with urllib.request.urlopen(req, timeout=600) as r:
        for line in r:
            line = line.decode().strip()
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            v = json.loads(line[6:])
            if v.get("usage"):
                n = v["usage"]["completion_tokens"]
            for c in v["choices"]:
                piece = c.get("text")
                if piece:
                    now = time.time()
                    first = first or now
                    last = now
                    text += piece
    return text, (n - 1) / (last - first)


def llama_lookup(binary, model, prompt, tokens, draft, threads):
    """llama-lookup's decode rate (its own timer, the prompt left out) and accepted drafts."""
    with tempfile.NamedTemporaryFile("w", suffix=".txt") as f:
        f.write(prompt)
        f.flush()
        out = subprocess.run([binary, "-m", model, "-f", f.name, "-n", str(tokens), "--spec-draft-n-max", str(draft),
                              "-t", str(threads), "--temp", "0", "--ignore-eos", "-c", "2048"], capture_output=True, text=True).stderr
    tps = float(re.search(r"decoded +\d+ tokens in +[\d.]+ seconds, speed: +([\d.]+) t/s", out).group(1))
    drafted = int(re.search(r"n_drafted += (\d+)", out).group(1))
    accepted = int(re.search(r"n_accept += (\d+)", out).group(1))
    return tps, drafted, accepted


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--model")
    ap.add_argument("--lookup", type=int, default=6)
    ap.add_argument("--tokens", type=int, default=200)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--llama-lookup")
    a = ap.parse_args()
    model = a.model or os.path.expanduser("~/.cache/corelm/models/SmolLM2-135M-Instruct.Q4_1.gguf")
    llama = {}
    best = {}
    texts = {}
    for r in range(a.rounds):
        for lookup in (0, a.lookup):
            p, port = serve(a.model, lookup, a.threads)
            try:
                for name, prompt in PROMPTS.items():
                    d0, k0 = metric(port, "corelm_draft_tokens_total"), metric(port, "corelm_draft_tokens_accepted_total")
                    text, tps = run(port, prompt, a.tokens)
                    d1, k1 = metric(port, "corelm_draft_tokens_total"), metric(port, "corelm_draft_tokens_accepted_total")
                    key = (name, lookup)
                    best[key] = max(best.get(key, (0, 0, 0))[0], tps), d1 - d0, k1 - k0
                    texts.setdefault(name, set()).add(text)
            finally:
                p.kill()
                p.wait()
        if a.llama_lookup:
            for name, prompt in PROMPTS.items():
                for draft in (0, a.lookup):
                    tps, d, k = llama_lookup(a.llama_lookup, model, prompt, a.tokens, draft, a.threads)
                    key = (name, draft)
                    llama[key] = max(llama.get(key, (0, 0, 0))[0], tps), d, k
    for name in PROMPTS:
        plain, spec = best[(name, 0)], best[(name, a.lookup)]
        print(f"{name:12s} plain {plain[0]:7.1f} t/s  lookup {spec[0]:7.1f} t/s  {spec[0] / plain[0]:.2f}x  "
              f"drafts kept {int(spec[2])}/{int(spec[1])}  answers equal: {len(texts[name]) == 1}")
        if llama:
            lp, ls = llama[(name, 0)], llama[(name, a.lookup)]
            print(f"{'':12s} llama.cpp plain {lp[0]:7.1f} t/s  llama-lookup {ls[0]:7.1f} t/s  {ls[0] / lp[0]:.2f}x  "
                  f"drafts kept {ls[2]}/{ls[1]}  corelm lookup / llama-lookup {spec[0] / ls[0]:.2f}")


if __name__ == "__main__":
    main()
