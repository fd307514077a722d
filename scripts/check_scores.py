#!/usr/bin/env python3
"""lm-evaluation-harness's scores from corelm next to llama.cpp's logits on the same tokens.

Reads the samples file `lm_eval --log_samples` wrote for a `multiple_choice` (loglikelihood)
task run against `corelm serve` (`scripts/lm_eval_local.sh`), evaluates every (context,
continuation) request with llama.cpp through llama-cpp-python (the pinned 0.3.35, llama.cpp
4df29be: every position's logits, flash attention on as the `auto` default of llama.cpp's tools
on CPU, an f64 log-softmax), tokenized as lm-eval's `local-completions`
does (the pair's text whole; the context's own tokens count as context), and prints the
largest log-likelihood difference, how often the greedy flags agree, and each side's accuracy.
llama-cpp-python's own server is not used: its `echo` log-probabilities sit one position off.

`--n-batch 1` (the default) feeds llama.cpp token by token: the summation order `serve` keeps
by default (batch-invariant: each row as if alone). `serve --no-batch-invariant` computes a
prompt as llama.cpp's prefill does; compare it with `--n-batch 512`.

    /work/cache/llama-venv/bin/python scripts/check_scores.py \\
        --model ~/.cache/corelm/models/SmolLM2-135M-Instruct.Q4_1.gguf --samples OUT/.../samples_*.jsonl
"""
import argparse
import json

import numpy as np


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", required=True)
    ap.add_argument("--samples", required=True)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--n-batch", type=int, default=1)
    a = ap.parse_args()
    from llama_cpp import Llama
    llm = Llama(model_path=a.model, n_ctx=1024, n_batch=a.n_batch, n_ubatch=a.n_batch, n_threads=a.threads, logits_all=True, flash_attn=True, verbose=False)
    enc = lambda s: llm.tokenize(s.encode("utf-8"), add_bos=False, special=True)
    docs = [json.loads(line) for line in open(a.samples)]
    worst, total, agree, n, acc_c, acc_l = 0.0, 0.0, 0, 0, 0, 0
    for d in docs:
        ours, theirs = [], []
        args = d["arguments"]
        pairs = [(x["arg_0"], x["arg_1"]) for x in args.values()] if isinstance(args, dict) else args
        for (ctx, cont), resp in zip(pairs, d["resps"]):
            # lm-eval moves the context's trailing spaces into the continuation.
            k = len(ctx) - len(ctx.rstrip(" "))
            ctx, cont = ctx[:len(ctx) - k], ctx[len(ctx) - k:] + cont
            whole, ctxlen = enc(ctx + cont), len(enc(ctx))
            llm.reset()
            llm.eval(whole)
            logits = np.array(llm.scores[:len(whole)], dtype=np.float64)
            lse = np.log(np.exp(logits - logits.max(1, keepdims=True)).sum(1)) + logits.max(1)
            ll, greedy = 0.0, True
            for p in range(ctxlen, len(whole)):
                row = logits[p - 1]
                ll += row[whole[p]] - lse[p - 1]
                greedy &= int(row.argmax()) == whole[p]
            got = float(resp[0][0]), resp[0][1] == "True"
            worst = max(worst, abs(got[0] - ll))
            total += abs(got[0] - ll)
            agree += got[1] == greedy
            n += 1
            ours.append(got[0])
            theirs.append(ll)
        target = d["target"] if isinstance(d["target"], int) else int(d["target"])
        acc_c += int(np.argmax(ours)) == target
        acc_l += int(np.argmax(theirs)) == target
    print(json.dumps({"requests": n, "max_abs_loglikelihood_diff": round(worst, 5), "mean_abs_loglikelihood_diff": round(total / n, 5), "greedy_flags_agree": agree,
                      "acc_corelm": acc_c / len(docs), "acc_llama_cpp": acc_l / len(docs), "docs": len(docs)}))


if __name__ == "__main__":
    main()
