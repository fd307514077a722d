#!/usr/bin/env python3
"""Check `corelm eval` output against a golden case with the four checks of
../shared/golden/README.md.

Usage:
  scripts/check_golden.py CASE.json FREE.json [TEACHER_FORCED.json]
where FREE.json is `corelm eval --case CASE.json` output and TEACHER_FORCED.json is the output
of the same with --teacher-forced. Exits non-zero on failure; prints one summary line.
"""
import json
import statistics
import sys

TOL = {"smollm2": 1.0, "qwen": 1.5, "gemma": 2.5}


def tolerance(case):
    name = case["model_file"].lower()
    for k, v in TOL.items():
        if k in name:
            return v
    return 1.0


def margin(top):
    return top[0][1] - top[1][1]


def compare_rows(ours, gold, tol, top1_margin, diffs, label):
    errors = []
    for i, (o, g) in enumerate(zip(ours, gold)):
        od = {t: l for t, l in o}
        for t, l in g:
            if t in od:
                d = abs(od[t] - l)
                diffs.append(d)
                if d > tol:
                    errors.append(f"{label}[{i}] id {t}: {od[t]:.3f} vs golden {l:.3f}")
        if margin(g) >= top1_margin and o[0][0] != g[0][0]:
            errors.append(f"{label}[{i}] top-1 {o[0][0]} vs golden {g[0][0]} (margin {margin(g):.2f})")
    return errors


def check(case, free, tf=None):
    tol = tolerance(case)
    errors = []
    if free["prompt_token_ids"] != case["prompt_token_ids"]:
        errors.append(f"tokenization differs: {free['prompt_token_ids'][:20]} vs {case['prompt_token_ids'][:20]}")
    diffs = []
    errors += compare_rows(free["prompt_top10"], case["prompt_top10"], tol, 1.5, diffs, "prompt")
    if tf is not None:
        errors += compare_rows(tf["greedy_top10"], case["greedy_top10"], tol, 0.5, diffs, "tf_step")
    # Free-running greedy: exact up to min(16, first near-tie step).
    limit = 16
    for k, top in enumerate(case["greedy_top10"]):
        if margin(top) < 0.25:
            limit = min(limit, k)
            break
    for k in range(min(limit, len(case["greedy_ids"]))):
        if free["greedy_ids"][k] != case["greedy_ids"][k]:
            errors.append(f"greedy step {k}: {free['greedy_ids'][k]} vs golden {case['greedy_ids'][k]}")
            break
    med = statistics.median(diffs) if diffs else 0.0
    mx = max(diffs) if diffs else 0.0
    return errors, med, mx


def main():
    case = json.load(open(sys.argv[1]))
    free = json.load(open(sys.argv[2]))
    tf = json.load(open(sys.argv[3])) if len(sys.argv) > 3 else None
    errors, med, mx = check(case, free, tf)
    status = "FAIL" if errors else "ok"
    print(f"{status} {case['case_id']}: median |dlogit| {med:.4f}, max {mx:.4f}, {len(errors)} errors")
    for e in errors[:10]:
        print("   ", e)
    sys.exit(1 if errors else 0)


if __name__ == "__main__":
    main()
