#!/usr/bin/env python3
"""Side-by-side speed of corelm and llama.cpp (llama-cpp-python) on the golden models.

Usage: scripts/bench_compare.py [--venv DIR] [--threads 1,2] [--pp 128] [--tg 64] [--reps 3]
                                [--models smollm2,gemma3,qwen2]

llama.cpp comes from a venv with `llama-cpp-python==0.3.35` (it vendors llama.cpp 4df29be, the
commit of the golden data). Create it once, outside the repository, with
    python3 -m venv ~/.cache/corelm/llama-venv
    CMAKE_ARGS=-DGGML_NATIVE=ON ~/.cache/corelm/llama-venv/bin/pip install llama-cpp-python==0.3.35
(10-20 minutes on 2 cores). Runs alternate A/B/A/B; the table shows medians and corelm/llama.cpp
ratios for prefill (pp) and decode (tg) tokens per second. Same prompt tokens, same thread
count, greedy decoding without stopping at end-of-generation tokens.
"""
import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import textwrap
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
FILES = {
    "smollm2": "SmolLM2-135M-Instruct.Q4_1.gguf",
    "gemma3": "gemma-3-270m-q4_k_m.gguf",
    "qwen2": "qwen2.5-coder-0.5b-instruct-awq-q4_k_m.gguf",
}
TEXT = (
    "The history of computing is a story of abstraction layered upon abstraction. Early machines "
    "were programmed by rewiring, then by punched cards, then by assembly language and compilers. "
)

LLAMA_SNIPPET = textwrap.dedent(
    """
    import json, sys, time
    from llama_cpp import Llama
    path, threads, n_pp, n_tg = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
    llm = Llama(model_path=path, n_ctx=2048, n_batch=512, n_ubatch=512, n_threads=threads,
                n_threads_batch=threads, verbose=False)
    toks = llm.tokenize(sys.argv[5].encode(), add_bos=True, special=True)[:n_pp]
    t0 = time.perf_counter(); llm.eval(toks); t1 = time.perf_counter()
    # Decode speed does not depend on which token is fed; llama-cpp-python keeps no logits
    # without logits_all (its `scores` rows stay unwritten), so feed a fixed token.
    nxt = toks[-1]
    t2 = time.perf_counter()
    for _ in range(n_tg):
        llm.eval([nxt])
    t3 = time.perf_counter()
    print(json.dumps({"n_prompt": len(toks), "pp": len(toks) / (t1 - t0), "tg": n_tg / (t3 - t2)}))
    """
)


def models_dir():
    if os.environ.get("CORELM_MODELS_DIR"):
        return Path(os.environ["CORELM_MODELS_DIR"])
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(Path.home(), ".cache")
    return Path(base) / "corelm" / "models"


def run_llama(py, model, threads, pp, tg, prompt):
    out = subprocess.run([py, "-c", LLAMA_SNIPPET, str(model), str(threads), str(pp), str(tg), prompt],
                         check=True, capture_output=True, text=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def run_corelm(binary, model, threads, pp, tg, prompt, n_prompt, extra=()):
    # Tokenize exactly as llama.cpp did and cut to the same length, so both see the same tokens.
    ids = json.loads(subprocess.run([binary, "tokenize", "--model", str(model), prompt],
                                    check=True, capture_output=True, text=True).stdout)[:n_prompt]
    out = subprocess.run(
        [binary, "run", "--model", str(model), "-t", str(threads), "--temp", "0", "--ignore-eos",
         "-n", str(tg), "-b", "512", "-c", "2048", "--prompt-ids", ",".join(map(str, ids)), *extra],
        check=True, capture_output=True, text=True)
    m = re.search(r"\[(\d+) prompt tokens in [\d.]+ s = ([\d.]+) t/s; (\d+) generated in [\d.]+ s = ([\d.]+) t/s", out.stderr)
    if not m:
        sys.exit(f"could not parse corelm output: {out.stderr}")
    return {"n_prompt": int(m.group(1)), "pp": float(m.group(2)), "tg": float(m.group(4))}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--venv", default=os.environ.get("LLAMA_VENV", str(Path.home() / ".cache/corelm/llama-venv")))
    ap.add_argument("--threads", default="1,2")
    ap.add_argument("--pp", type=int, default=128)
    ap.add_argument("--tg", type=int, default=64)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--models", default="smollm2,gemma3,qwen2", help="golden model names or GGUF paths")
    ap.add_argument("--corelm-args", default="", help="extra flags for `corelm run`, e.g. --fast-prefill")
    a = ap.parse_args()
    py = Path(a.venv) / "bin" / "python"
    if not py.exists():
        sys.exit(f"no llama-cpp-python venv at {a.venv}; see this script's docstring")
    subprocess.run(["cargo", "build", "--release", "-q", "-p", "corelm-cli"], cwd=ROOT, check=True)
    binary = ROOT / "target" / "release" / "corelm"
    prompt = TEXT * 20
    cpu = next((l.split(":", 1)[1].strip() for l in open("/proc/cpuinfo") if l.startswith("model name")), "?")
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True).stdout.strip()
    print(f"# corelm {commit} {a.corelm_args} vs llama.cpp (llama-cpp-python 0.3.35) on {cpu}; pp{a.pp} tg{a.tg}, {a.reps} reps, medians")
    print("| model | threads | llama.cpp pp t/s | corelm pp t/s | pp ratio | llama.cpp tg t/s | corelm tg t/s | tg ratio |")
    print("|---|---|---|---|---|---|---|---|")
    for name in a.models.split(","):
        model = models_dir() / FILES[name] if name in FILES else Path(name)
        for t in [int(x) for x in a.threads.split(",")]:
            L, C = [], []
            for _ in range(a.reps):
                l = run_llama(py, model, t, a.pp, a.tg, prompt)
                L.append(l)
                C.append(run_corelm(binary, model, t, a.pp, a.tg, prompt, l["n_prompt"], a.corelm_args.split()))
            med = lambda xs, k: statistics.median(x[k] for x in xs)
            lp, cp, lt, ct = med(L, "pp"), med(C, "pp"), med(L, "tg"), med(C, "tg")
            print(f"| {name} | {t} | {lp:.1f} | {cp:.1f} | {cp / lp:.2f} | {lt:.1f} | {ct:.1f} | {ct / lt:.2f} |", flush=True)


if __name__ == "__main__":
    main()
