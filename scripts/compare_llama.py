#!/usr/bin/env python3
"""corelm against llama.cpp (llama-cpp-python) on any GGUF, for models without golden data
(a BF16 or F16 conversion made with `corelm quantize`, another quantization).

For each prompt case (the prompts of a ../shared/golden directory), llama.cpp evaluates the
prompt with the golden settings (2 threads, n_ctx 2048, n_batch 2048, n_ubatch 512, flash
attention on, F16 KV cache) and decodes greedily; corelm evaluates the same tokens
teacher-forced (`corelm eval --teacher-forced`). Per case it prints how many positions have
all of llama.cpp's top-10 logits bit for bit, the largest and median |Δlogit| over those
ids, and whether the top-1 ids agree. Exits non-zero if a top-1 id differs where llama.cpp's
margin is at least 0.5.

    /work/cache/llama-venv/bin/python scripts/compare_llama.py --model /tmp/smol-bf16.gguf \\
        --cases ../shared/golden/SmolLM2-135M-Instruct.Q4_1

Not run in CI: it needs the llama-cpp-python venv (built from source, see bench_compare.py).
"""
import argparse
import glob
import json
import os
import statistics
import subprocess
import sys
import tempfile

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def top10(row):
    idx = np.argsort(-row, kind="stable")[:10]
    return [(int(i), float(row[i])) for i in idx]


def llama_run(llm, tokens, n_greedy):
    """Prompt rows' top-10 and `n_greedy` greedy steps (ids and their top-10)."""
    llm.reset()
    llm.eval(tokens)
    prompt = [top10(np.array(r, dtype=np.float32)) for r in llm.scores[: len(tokens)]]
    ids, steps = [], []
    last = np.array(llm.scores[len(tokens) - 1], dtype=np.float32)
    for _ in range(n_greedy):
        steps.append(top10(last))
        nxt = int(np.argmax(last))
        ids.append(nxt)
        llm.eval([nxt])
        last = np.array(llm.scores[llm.n_tokens - 1], dtype=np.float32)
    return prompt, ids, steps


def corelm_run(exe, model, case, threads):
    with tempfile.NamedTemporaryFile("w", suffix=".json", delete=False) as f:
        json.dump(case, f)
        path = f.name
    try:
        out = subprocess.run(
            [exe, "eval", "-m", model, "-t", str(threads), "--case", path, "--teacher-forced"],
            check=True, capture_output=True, text=True,
        ).stdout
    finally:
        os.unlink(path)
    return json.loads(out)


def compare(ours, theirs):
    """(rows equal bit for bit, |Δ| over llama.cpp's top-10 ids present in ours, top-1 misses)."""
    exact, diffs, misses = 0, [], []
    for i, (o, t) in enumerate(zip(ours, theirs)):
        od = dict((int(k), float(v)) for k, v in o)
        d = [abs(np.float32(od[k]) - np.float32(v)) for k, v in t if k in od]
        diffs += d
        exact += all(k in od and np.float32(od[k]) == np.float32(v) for k, v in t)
        if o[0][0] != t[0][0]:
            misses.append((i, t[0][1] - t[1][1]))
    return exact, diffs, misses


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", required=True)
    ap.add_argument("--cases", required=True, help="a golden directory whose pNN_*.json prompts to use")
    ap.add_argument("--n-greedy", type=int, default=16)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--corelm", default=os.path.join(ROOT, "target", "release", "corelm"))
    a = ap.parse_args()
    from llama_cpp import Llama

    kw = dict(n_ctx=2048, n_batch=2048, n_ubatch=512, n_threads=a.threads, n_threads_batch=a.threads, logits_all=True, verbose=False)
    try:
        llm = Llama(model_path=a.model, flash_attn=True, **kw)
    except TypeError:
        llm = Llama(model_path=a.model, **kw)
    bad = False
    for path in sorted(glob.glob(os.path.join(a.cases, "p[0-9]*.json"))):
        case = json.load(open(path))
        tokens = case["prompt_token_ids"]
        prompt, ids, steps = llama_run(llm, tokens, a.n_greedy)
        mine = {"prompt": case["prompt"], "add_bos": case["add_bos"], "prompt_token_ids": tokens, "greedy_ids": ids, "case_id": case["case_id"]}
        out = corelm_run(a.corelm, a.model, mine, a.threads)
        exact, diffs, misses = compare(out["prompt_top10"] + out["greedy_top10"], prompt + steps)
        rows = len(prompt) + len(steps)
        real = [m for m in misses if m[1] >= 0.5]
        bad |= bool(real) or out["prompt_token_ids"] != tokens
        print(
            f"{case['case_id']}: {exact}/{rows} rows bit for bit; |Δlogit| max {max(diffs):.5f} median {statistics.median(diffs):.5f}; "
            f"top-1 differs at {len(misses)} rows ({len(real)} with margin ≥ 0.5)"
        )
    sys.exit(1 if bad else 0)


if __name__ == "__main__":
    main()
