#!/usr/bin/env python3
"""corelm perplexity next to llama.cpp's on the same model, text and context size.

llama.cpp's side is computed through llama-cpp-python (the pinned 0.3.35, llama.cpp 4df29be)
with llama-perplexity's protocol: the text tokenized with BOS (if the model adds one), chunks
of n_ctx tokens each evaluated from an empty cache with its first token replaced by BOS, the
second half of each chunk scored with an f64 log-softmax. Flash attention is on, as the
`auto` default of llama.cpp's tools on CPU.

    /work/cache/llama-venv/bin/python scripts/check_perplexity.py \\
        --model ~/.cache/corelm/models/SmolLM2-135M-Instruct.Q4_1.gguf \\
        --file fixtures/ppl-gpl3.txt --ctx 512
"""
import argparse
import json
import os
import subprocess
import time

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def llama_cpp_ppl(model, text, n_ctx, threads, chunks):
    from llama_cpp import Llama
    llm = Llama(model_path=model, n_ctx=n_ctx, n_batch=n_ctx, n_ubatch=n_ctx, n_threads=threads,
                logits_all=True, flash_attn=True, verbose=False)
    tokens = llm.tokenize(text.encode("utf-8"), add_bos=True, special=False)
    add_bos = llm._model.add_bos_token()
    bos = llm.token_bos()
    n_chunk = len(tokens) // n_ctx
    if chunks:
        n_chunk = min(n_chunk, chunks)
    first = n_ctx // 2
    nll, nll2, count = 0.0, 0.0, 0
    t0 = time.time()
    for c in range(n_chunk):
        chunk = list(tokens[c * n_ctx:(c + 1) * n_ctx])
        if add_bos:
            chunk[0] = bos
        llm.reset()
        llm.eval(chunk)
        logits = np.array(llm.scores[:n_ctx], dtype=np.float32)
        for p in range(first, n_ctx - 1):
            row = logits[p]
            m = row.max()
            lse = np.log(np.exp((row - m).astype(np.float32)).astype(np.float64).sum())
            v = -(float(row[tokens[c * n_ctx + p + 1]] - m) - lse)
            nll += v
            nll2 += v * v
            count += 1
    mean = nll / count
    ppl = float(np.exp(mean))
    var = nll2 / count - mean * mean
    err = float(np.sqrt(var / (count - 1)) * ppl) if var > 0 else 0.0
    return {"ppl": ppl, "ppl_stderr": err, "n_chunks": n_chunk, "tokens": len(tokens),
            "tokens_scored": count, "seconds": time.time() - t0}


def corelm_ppl(model, file, n_ctx, threads, chunks, cache_type):
    exe = os.path.join(ROOT, "target", "release", "corelm")
    cmd = [exe, "perplexity", "-m", model, "-f", file, "-c", str(n_ctx), "-b", str(n_ctx),
           "-t", str(threads), "--json", "-k", cache_type, "-v", cache_type]
    if chunks:
        cmd += ["--chunks", str(chunks)]
    out = subprocess.run(cmd, check=True, capture_output=True, text=True).stdout
    return json.loads(out.strip().splitlines()[-1])


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", required=True)
    ap.add_argument("--file", default=os.path.join(ROOT, "fixtures", "ppl-gpl3.txt"))
    ap.add_argument("--ctx", type=int, default=512)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--chunks", type=int, default=0)
    a = ap.parse_args()
    text = open(a.file, encoding="utf-8").read()
    ours = corelm_ppl(a.model, a.file, a.ctx, a.threads, a.chunks, "f16")
    ref = llama_cpp_ppl(a.model, text, a.ctx, a.threads, a.chunks)
    rel = ours["ppl"] / ref["ppl"] - 1
    print(f"model {os.path.basename(a.model)}, {a.file}, ctx {a.ctx}, {ref['n_chunks']} chunks")
    print(f"  llama.cpp: PPL {ref['ppl']:.4f} +/- {ref['ppl_stderr']:.4f} ({ref['seconds']:.1f} s)")
    print(f"  corelm:    PPL {ours['ppl']:.4f} +/- {ours['ppl_stderr']:.4f} ({ours['seconds']:.1f} s)")
    print(f"  relative difference {rel * 100:+.3f} %")
    print(json.dumps({"llama_cpp": ref, "corelm": ours, "rel_diff": rel}))


if __name__ == "__main__":
    main()
