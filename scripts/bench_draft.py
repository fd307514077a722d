#!/usr/bin/env python3
"""Speculative decoding with a draft model (`corelm run --spec-draft-model D`) against plain
decoding of the same target: greedy answers to raw prompts (no chat template), `-n` tokens
each (`--ignore-eos`), one process at a time, the variants interleaved in every round; decode
tokens/s, drafts fed and kept, and whether the text equals the plain answer. With
`--llama-bin DIR` (a build of the pinned llama.cpp with `llama-speculative-simple` and
`llama-bench`), llama.cpp on the same pair and prompts in the same rounds: its speculative
decoding (`--spec-type draft-simple`) and its plain `tg` rate.

    scripts/bench_draft.py --target T.gguf --draft D.gguf [--n-max 2,4] [--tokens 128] \
        [--rounds 3] [--threads 2] [--llama-bin /tmp/lcps/bin]
"""
import argparse
import os
import re
import subprocess

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PROMPTS = {
    "story": "Write a short story about a robot who learns to paint. Use simple words.",
    "facts": "The water cycle has four stages. The first stage is",
}


def corelm(target, draft, n_max, prompt, tokens, threads):
    args = [os.path.join(ROOT, "target/release/corelm"), "run", "-m", target, "--temp", "0", "-n", str(tokens), "--ignore-eos", "-t", str(threads), "-p", prompt]
    if draft:
        args += ["--spec-draft-model", draft, "--spec-draft-n-max", str(n_max)]
    r = subprocess.run(args, capture_output=True, text=True, check=True)
    tps = float(re.search(r"generated in [\d.]+ s = ([\d.]+) t/s", r.stderr).group(1))
    m = re.search(r"drafts: (\d+) fed, (\d+) kept", r.stderr)
    return tps, (int(m.group(1)), int(m.group(2))) if m else (0, 0), r.stdout


def llama_spec(bin_dir, target, draft, n_max, prompt, tokens, threads):
    args = [os.path.join(bin_dir, "llama-speculative-simple"), "-m", target, "-md", draft, "--spec-type", "draft-simple", "--spec-draft-n-max", str(n_max),
            "-p", prompt, "-n", str(tokens), "--temp", "0", "-t", str(threads), "-c", "2048", "--ignore-eos"]
    r = subprocess.run(args, capture_output=True, text=True)
    out = r.stdout + r.stderr
    tps = float(re.search(r"decoded\s+\d+ tokens in\s+[\d.]+ seconds, speed:\s+([\d.]+) t/s", out).group(1))
    fed, kept = (int(re.search(rf"{k}\s*=\s*(\d+)", out).group(1)) for k in ("n_drafted", "n_accept"))
    return tps, (fed, kept)


def llama_tg(bin_dir, target, tokens, threads):
    r = subprocess.run([os.path.join(bin_dir, "llama-bench"), "-m", target, "-p", "0", "-n", str(tokens), "-t", str(threads), "-r", "2", "-o", "csv"], capture_output=True, text=True, check=True)
    row = r.stdout.strip().splitlines()[-1]
    return float(re.findall(r'"([\d.]+)"', row)[-2])


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--target", required=True)
    ap.add_argument("--draft", required=True)
    ap.add_argument("--n-max", default="2,4")
    ap.add_argument("--tokens", type=int, default=128)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--llama-bin")
    a = ap.parse_args()
    n_maxes = [int(n) for n in a.n_max.split(",")]
    rows = {}
    for rnd in range(a.rounds):
        for name, prompt in PROMPTS.items():
            plain, _, text = corelm(a.target, None, 0, prompt, a.tokens, a.threads)
            rows.setdefault((name, "corelm", 0), []).append((plain, (0, 0), True))
            for n in n_maxes:
                tps, counts, t = corelm(a.target, a.draft, n, prompt, a.tokens, a.threads)
                rows.setdefault((name, "corelm", n), []).append((tps, counts, t == text))
                if a.llama_bin:
                    tps, counts = llama_spec(a.llama_bin, a.target, a.draft, n, prompt, a.tokens, a.threads)
                    rows.setdefault((name, "llama.cpp", n), []).append((tps, counts, None))
        if a.llama_bin:
            rows.setdefault(("(tg)", "llama.cpp", 0), []).append((llama_tg(a.llama_bin, a.target, a.tokens, a.threads), (0, 0), None))
        print(f"round {rnd + 1} done", flush=True)
    print(f"target {os.path.basename(a.target)}, draft {os.path.basename(a.draft)}, {a.tokens} tokens, {a.threads} threads, median of {a.rounds} rounds")
    print("| prompt | engine | n-max | decode t/s | drafts kept/fed | same text as plain |")
    print("|---|---|---|---|---|---|")
    for (name, engine, n), v in rows.items():
        tps = sorted(x[0] for x in v)[len(v) // 2]
        fed, kept = v[0][1]
        same = "" if v[0][2] is None else ("yes" if all(x[2] for x in v) else "NO")
        print(f"| {name} | {engine} | {n or 'plain'} | {tps:.1f} | {kept}/{fed} | {same} |")


if __name__ == "__main__":
    main()
