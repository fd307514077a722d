#!/usr/bin/env python3
"""Load benchmark for OpenAI-compatible servers: corelm serve vs llama.cpp's own C++ `llama-server`
(continuous batching over `--parallel` slots; `--servers llama-server`) or llama-cpp-python's
one-request server (`--servers llama.cpp`).

Poisson arrivals at increasing rates; per request a prompt and an output length drawn from a
chat-like distribution (stated below, seeded, identical for both servers); streaming
/v1/completions at temperature 0. Reports TTFT and TPOT p50/p90/p99, throughput (generated
tokens/s and requests/s) and goodput: requests per second that met the SLO
(TTFT <= --slo-ttft and TPOT <= --slo-tpot, per request).

Distribution ("chat-like", after ShareGPT's shape, scaled to a small model's context):
  prompt tokens ~ lognormal(median 96, sigma 0.7) clipped to [16, 512]
  output tokens ~ lognormal(median 48, sigma 0.6) clipped to [8, 192]
Prompts are built from a fixed word list so their token counts are close to the draw.

Needs: `openai`-venv's httpx (scripts/test_openai_client.sh makes it) or any Python with httpx;
for llama.cpp the llama-cpp-python venv (see scripts/bench_compare.py) with the server extras
(`pip install uvicorn fastapi sse-starlette starlette-context pydantic-settings`).

Usage:
  python scripts/bench_serve.py --rates 0.2,0.4,0.6,0.8 --requests 24 --servers corelm,llama-server \
      [--llama-server ~/.cache/corelm/llama/build-native/bin/llama-server] [--threads 2] [--parallel 4] \
      [--plan corelm-plan.json]
  (llama-server is built from the pinned sdist outside the repo: cmake --build BUILD --target llama-server)
"""

import argparse
import asyncio
import json
import math
import os
import random
import shlex
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
WORDS = ("time people year way day thing man world life hand part child eye woman place work week "
         "case point government company number group problem fact water story river music city "
         "house night money book question school family mountain ocean garden kitchen winter").split()


def models_dir():
    if os.environ.get("CORELM_MODELS_DIR"):
        return Path(os.environ["CORELM_MODELS_DIR"])
    base = Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache"))
    return base / "corelm" / "models"


def workload(n, seed):
    rng = random.Random(seed)
    out = []
    for i in range(n):
        p = int(min(512, max(16, rng.lognormvariate(math.log(96), 0.7))))
        o = int(min(192, max(8, rng.lognormvariate(math.log(48), 0.6))))
        words = [rng.choice(WORDS) for _ in range(p)]
        text = f"Request {i}. Summarise these notes, then continue the story: " + " ".join(words)
        out.append((text, o))
    return out


def free_port():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


def wait_health(url, proc, timeout=300):
    t0 = time.time()
    while time.time() - t0 < timeout:
        if proc.poll() is not None:
            raise RuntimeError(f"server exited with {proc.returncode}")
        try:
            urllib.request.urlopen(url, timeout=1)
            return
        except Exception:
            time.sleep(0.2)
    raise RuntimeError("server did not come up")


async def one(client, base, model, prompt, max_tokens, extra):
    try:
        return await one_(client, base, model, prompt, max_tokens, extra)
    except Exception as e:  # a server that drops the connection fails this request only
        return {"ok": False, "status": repr(e)}


async def one_(client, base, model, prompt, max_tokens, extra):
    body = {"model": model, "prompt": prompt, "max_tokens": max_tokens, "temperature": 0, "stream": True, **extra}
    t0 = time.perf_counter()
    first, last, n = None, None, 0
    async with client.stream("POST", f"{base}/v1/completions", json=body, timeout=600) as r:
        if r.status_code != 200:
            await r.aread()
            return {"ok": False, "status": r.status_code}
        async for line in r.aiter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            chunk = json.loads(line[6:])
            if chunk.get("choices") and chunk["choices"][0].get("text"):
                now = time.perf_counter()
                first = first or now
                last = now
                n += 1
    if first is None:
        return {"ok": False, "status": 200}
    tpot = (last - first) / (n - 1) if n > 1 else 0.0
    return {"ok": True, "ttft": first - t0, "tpot": tpot, "tokens": n, "end": last}


async def run_rate(base, model, work, rate, seed, extra):
    import httpx

    rng = random.Random(seed)
    limits = httpx.Limits(max_connections=len(work) + 4, max_keepalive_connections=0)
    async with httpx.AsyncClient(limits=limits) as client:
        tasks = []
        start = time.perf_counter()
        t = 0.0
        for prompt, out in work:
            t += rng.expovariate(rate)
            delay = start + t - time.perf_counter()
            if delay > 0:
                await asyncio.sleep(delay)
            tasks.append(asyncio.create_task(one(client, base, model, prompt, out, extra)))
        res = await asyncio.gather(*tasks)
        wall = max([r["end"] for r in res if r["ok"]], default=time.perf_counter()) - start
    return res, wall


def pct(xs, p):
    if not xs:
        return float("nan")
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(round(p / 100 * (len(xs) - 1))))]


def summarise(name, rate, res, wall, slo_ttft, slo_tpot):
    ok = [r for r in res if r["ok"]]
    ttft = [r["ttft"] for r in ok]
    tpot = [r["tpot"] for r in ok if r["tokens"] > 1]
    good = [r for r in ok if r["ttft"] <= slo_ttft and r["tpot"] <= slo_tpot]
    toks = sum(r["tokens"] for r in ok)
    return {
        "server": name, "rate": rate, "requests": len(res), "failed": len(res) - len(ok),
        "ttft_p50": pct(ttft, 50), "ttft_p90": pct(ttft, 90), "ttft_p99": pct(ttft, 99),
        "tpot_p50": pct(tpot, 50), "tpot_p90": pct(tpot, 90), "tpot_p99": pct(tpot, 99),
        "tok_s": toks / wall, "req_s": len(ok) / wall, "goodput": len(good) / wall,
        "slo_ok": len(good) / max(1, len(res)),
    }


def start_corelm(model, port, args, extra=()):
    exe = ROOT / "target" / "release" / "corelm"
    subprocess.run(["cargo", "build", "--release", "-q", "-p", "corelm-cli"], cwd=ROOT, check=True)
    cmd = [str(exe), "serve", "-m", str(model), "--port", str(port), "-t", str(args.threads),
           "--parallel", str(args.parallel), "--ctx-size", "2048", "-b", str(args.batch), "--max-queue", "1000",
           "--tpot-target-ms", str(args.tpot_target_ms)]
    if args.plan:
        # The plan sets the workers and groups.
        i = cmd.index("-t")
        del cmd[i:i + 2]
        cmd += ["--plan", args.plan]
    cmd += list(extra)
    return subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def start_llama_server(model, port, args):
    exe = Path(args.llama_server).expanduser()
    # One KV cache shared by the slots: 2048 tokens each, as corelm's --ctx-size.
    cmd = [str(exe), "-m", str(model), "--port", str(port), "-t", str(args.threads), "-tb", str(args.threads),
           "-np", str(args.parallel), "-c", str(2048 * args.parallel), "-b", "512", "-fa", "on", "--no-webui"]
    return subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def start_llama(model, port, args):
    py = Path(args.llama_venv).expanduser() / "bin" / "python"
    cmd = [str(py), "-m", "llama_cpp.server", "--model", str(model), "--port", str(port), "--n_threads", str(args.threads),
           "--n_threads_batch", str(args.threads), "--n_ctx", "2048", "--n_batch", "512", "--verbose", "False",
           # Queue concurrent requests instead of cutting the running stream short (its default).
           "--interrupt_requests", "False"]
    return subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default=str(models_dir() / "SmolLM2-135M-Instruct.Q4_1.gguf"))
    ap.add_argument("--rates", default="0.2,0.4,0.6,0.8")
    ap.add_argument("--requests", type=int, default=24)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--parallel", type=int, default=4)
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--tpot-target-ms", type=float, default=0.0, help="corelm's step-time target (0 = off)")
    ap.add_argument("--slo-ttft", type=float, default=2.0)
    ap.add_argument("--slo-tpot", type=float, default=0.1)
    ap.add_argument("--seed", type=int, default=7)
    ap.add_argument("--llama-venv", default=os.environ.get("CORELM_LLAMA_VENV", "~/.cache/corelm/llama-venv"))
    ap.add_argument("--llama-server", default=os.environ.get("CORELM_LLAMA_SERVER", "~/.cache/corelm/llama/build-native/bin/llama-server"))
    ap.add_argument("--plan", help="a corelm tune plan file for corelm serve")
    ap.add_argument("--servers", default="corelm,llama-server",
                    help="any of corelm, corelm+ (corelm serve with --corelm-args), llama-server, llama.cpp")
    ap.add_argument("--corelm-args", default="", help="more `corelm serve` flags for the corelm+ server, "
                    "e.g. '--no-batch-invariant --fast-prefill'")
    ap.add_argument("--json", help="write all rows to this file")
    args = ap.parse_args()
    model = Path(args.model)
    model_id = model.stem
    rates = [float(r) for r in args.rates.split(",")]
    rows = []
    for name in args.servers.split(","):
        port = free_port()
        start = {"corelm": start_corelm, "llama-server": start_llama_server, "llama.cpp": start_llama,
                 "corelm+": lambda m, p, a: start_corelm(m, p, a, shlex.split(a.corelm_args))}[name]
        proc = start(model, port, args)
        if name == "corelm+":
            name = f"corelm {args.corelm_args}"
        base = f"http://127.0.0.1:{port}"
        try:
            wait_health(f"{base}/v1/models", proc)
            extra = {}
            asyncio.run(run_rate(base, model_id, workload(2, 99), 10.0, 1, extra))  # warm-up
            for i, rate in enumerate(rates):
                work = workload(args.requests, args.seed + i)
                res, wall = asyncio.run(run_rate(base, model_id, work, rate, args.seed + 100 + i, extra))
                row = summarise(name, rate, res, wall, args.slo_ttft, args.slo_tpot)
                rows.append(row)
                print(json.dumps(row), file=sys.stderr)
        finally:
            proc.terminate()
            proc.wait()
    print(f"\nmodel {model_id}, {args.threads} threads, {args.requests} requests per rate, "
          f"SLO: TTFT <= {args.slo_ttft}s and TPOT <= {args.slo_tpot * 1000:.0f}ms per request\n")
    print("| server | rate req/s | TTFT p50 / p90 / p99 s | TPOT p50 / p90 / p99 ms | tokens/s | req/s | goodput req/s | in SLO |")
    print("|---|---|---|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['server']} | {r['rate']:g} | {r['ttft_p50']:.2f} / {r['ttft_p90']:.2f} / {r['ttft_p99']:.2f} | "
              f"{r['tpot_p50'] * 1e3:.0f} / {r['tpot_p90'] * 1e3:.0f} / {r['tpot_p99'] * 1e3:.0f} | {r['tok_s']:.1f} | "
              f"{r['req_s']:.2f} | {r['goodput']:.2f} | {r['slo_ok'] * 100:.0f}% |")
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()
