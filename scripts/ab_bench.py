#!/usr/bin/env python3
"""A/B timing of corelm variants, run in turn, for machines whose speed drifts between minutes.

On the shared development VMs one binary's tg128 moves by 10-25 % between runs a minute apart,
so a change of a few percent only shows when the variants alternate and the comparison is made
per round: each round runs every variant once (the order rotated from round to round), and
each variant is judged by the ratios to the first variant *within* rounds. Printed per test:
every variant's median, minimum and maximum; against the first variant, the median of the
per-round ratios, a 95 % interval for it (bootstrap over rounds, fixed seed), and how many rounds
it won. A variant is a binary, optionally with flags of its own:

    scripts/ab_bench.py --rounds 8 --variant base=/tmp/corelm_base --variant new=target/release/corelm \\
        -- -m ~/.cache/corelm/models/SmolLM2-135M-Instruct.Q4_1.gguf -p 512 -n 128 -r 1
    scripts/ab_bench.py --variant 'rows=target/release/corelm --kv-layout rows' \\
        --variant 'cols=target/release/corelm --kv-layout columns' \\
        -- -m MODEL --npl 1,16 -p 128 -n 32 -r 1 --fast-prefill --isa avx2

Everything after `--` goes to every variant's `corelm bench` (with `--json` added); tests are
llama-bench's (pp/tg t/s, higher is better) or, with `--npl`, llama-batched-bench's (S_PP and
S_TG per sequence count). With `--gemm`, the variants are `scripts/gemm_bench` binaries and the
arguments theirs; the test is µs per call (lower is better).
"""
import argparse
import json
import random
import re
import shlex
import statistics
import subprocess
import sys


def parse_variant(s):
    name, _, cmd = s.partition("=")
    if not name or not cmd:
        sys.exit(f"--variant wants NAME=BINARY [FLAGS...], got {s!r}")
    return name, shlex.split(cmd)


def run_bench(cmd, args):
    """One `corelm bench --json` run: {test: (value, higher_is_better)}."""
    out = subprocess.run(cmd[:1] + ["bench"] + args + cmd[1:] + ["--json"], capture_output=True, text=True)
    if out.returncode != 0:
        sys.exit(f"{' '.join(cmd)} failed:\n{out.stderr[-2000:]}")
    tests = {}
    for line in out.stdout.splitlines():
        line = line.strip()
        if not line.startswith("{"):
            continue
        r = json.loads(line)
        if "npl" in r:
            b = r["npl"]
            tests[f"B={b} S_PP"] = (b * r["npp"] / r["t_pp"], True)
            tests[f"B={b} S_TG"] = (b * r["ntg"] / r["t_tg"], True)
        else:
            kind = f"pp{r['n_prompt']}" if r["n_gen"] == 0 else f"tg{r['n_gen']}"
            depth = f" @ d{r['n_depth']}" if r.get("n_depth") else ""
            tests[f"{kind}{depth} t{r['n_threads']}"] = (r["avg_ts"], True)
    return tests


def run_gemm(cmd, args):
    """One `gemm-bench` run: µs per call."""
    out = subprocess.run(cmd + args, capture_output=True, text=True)
    m = re.search(r"([0-9.]+) µs", out.stdout)
    if out.returncode != 0 or not m:
        sys.exit(f"{' '.join(cmd)} failed:\n{out.stdout[-1000:]}{out.stderr[-1000:]}")
    return {"µs per call": (float(m.group(1)), False)}


def bootstrap_median(xs, rng, n=2000):
    """A 95 % interval for the median of `xs`, resampling `xs` with replacement."""
    meds = sorted(statistics.median(rng.choices(xs, k=len(xs))) for _ in range(n))
    return meds[int(0.025 * n)], meds[int(0.975 * n) - 1]


def main():
    argv = sys.argv[1:]
    rest = []
    if "--" in argv:
        i = argv.index("--")
        argv, rest = argv[:i], argv[i + 1:]
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--variant", action="append", required=True, help="NAME=BINARY [FLAGS...] (the first is the baseline)")
    ap.add_argument("--rounds", type=int, default=8)
    ap.add_argument("--gemm", action="store_true", help="the variants are scripts/gemm_bench binaries")
    a = ap.parse_args(argv)
    variants = [parse_variant(v) for v in a.variant]
    if len(variants) < 2:
        sys.exit("give at least two --variant")
    run = run_gemm if a.gemm else run_bench
    # results[test][variant] = [value per round]
    results, better = {}, {}
    for r in range(a.rounds):
        order = variants[r % len(variants):] + variants[:r % len(variants)]
        for name, cmd in order:
            for test, (value, hib) in run(cmd, rest).items():
                results.setdefault(test, {}).setdefault(name, []).append(value)
                better[test] = hib
        print(f"round {r + 1}/{a.rounds} done", file=sys.stderr)
    rng = random.Random(1)
    base = variants[0][0]
    print(f"{a.rounds} rounds, variants in turn; ratios are per round against {base} (above 1: faster)\n")
    print("| test | variant | median | min | max | ratio (median) | 95 % interval | rounds won |")
    print("|---|---|---|---|---|---|---|---|")
    for test, per in results.items():
        for name, _ in variants:
            xs = per.get(name, [])
            if not xs:
                continue
            row = f"| {test} | {name} | {statistics.median(xs):.1f} | {min(xs):.1f} | {max(xs):.1f} |"
            if name == base or len(per.get(base, [])) != len(xs):
                print(row + " | | |")
                continue
            # Speed ratios: above 1 means this variant is faster, whichever way the test counts.
            ratios = [(x / b) if better[test] else (b / x) for x, b in zip(xs, per[base])]
            lo, hi = bootstrap_median(ratios, rng)
            won = sum(q > 1 for q in ratios)
            print(row + f" {statistics.median(ratios):.3f} | {lo:.3f}–{hi:.3f} | {won}/{len(ratios)} |")


if __name__ == "__main__":
    main()
