#!/usr/bin/env python3
"""Side-by-side speed of `corelm bench` and llama.cpp's own `llama-bench` on the golden models.

Usage: scripts/bench_compare.py --llama-bench PATH [--isa avx2] [--threads 1,2] [--pp 512]
                                [--tg 128] [--reps 3] [--rounds 2] [--models smollm2,gemma3,qwen2]
                                [--corelm-args "..."] [--record docs/benchmarks.md]

llama.cpp is the one the golden data came from: the sdist of `llama-cpp-python==0.3.35` vendors
llama.cpp 4df29be. Build its `llama-bench` once, outside the repository (10-20 minutes on 2
cores), for the ISA under test:

    # The sdist's link from PyPI's simple index (`pip download --no-binary :all:` builds the
    # sdist's build dependencies, cmake included, from source first: many minutes):
    curl -sL -o llama_cpp_python-0.3.35.tar.gz "$(curl -s https://pypi.org/simple/llama-cpp-python/ \
        | grep -o 'https://[^"#]*llama_cpp_python-0.3.35.tar.gz' | head -1)"
    tar xzf llama_cpp_python-0.3.35.tar.gz && cd llama_cpp_python-0.3.35/vendor/llama.cpp
    # AVX2 only (the `--isa avx2` comparison on an AVX-512 CPU, or any AVX2-only CPU):
    cmake -B ~/.cache/corelm/llama/build-avx2 -DGGML_NATIVE=OFF -DGGML_AVX=ON -DGGML_AVX2=ON \\
          -DGGML_FMA=ON -DGGML_F16C=ON -DGGML_AVX512=OFF -DLLAMA_CURL=OFF -DCMAKE_BUILD_TYPE=Release
    # or everything this CPU has:  -DGGML_NATIVE=ON
    cmake --build ~/.cache/corelm/llama/build-avx2 --target llama-bench -j2

Both tools time the same thing (llama-bench's tests: pp = a batch of random prompt tokens, tg =
single-token decode steps after it), same model, threads, pp and tg lengths and repetitions.
Rounds alternate the order of the two tools; the table shows the medians over rounds of each
tool's mean, the corelm/llama.cpp ratios, and for decode corelm's share of its memory roofline
(read bandwidth measured by `corelm bench` ÷ bytes read per token). The header names both
sides' ISA: corelm's kernel table, and llama.cpp's from the build's CMakeCache.txt.
"""
import argparse
import datetime
import json
import os
import re
import statistics
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
FILES = {
    "smollm2": "SmolLM2-135M-Instruct.Q4_1.gguf",
    "gemma3": "gemma-3-270m-q4_k_m.gguf",
    "qwen2": "qwen2.5-coder-0.5b-instruct-awq-q4_k_m.gguf",
}


def models_dir():
    if os.environ.get("CORELM_MODELS_DIR"):
        return Path(os.environ["CORELM_MODELS_DIR"])
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(Path.home(), ".cache")
    return Path(base) / "corelm" / "models"


def llama_isa(llama_bench):
    """The x86 flags llama-bench was built with, read from its build's CMakeCache.txt."""
    for d in [Path(llama_bench).resolve().parent, *Path(llama_bench).resolve().parents]:
        cache = d / "CMakeCache.txt"
        if cache.exists():
            flags = dict(re.findall(r"^(GGML_[A-Z0-9_]+):BOOL=(\w+)", cache.read_text(), re.M))
            if flags.get("GGML_NATIVE") == "ON":
                return "GGML_NATIVE=ON: -march=native, every ISA extension of the build machine"
            keys = ["GGML_AVX2", "GGML_AVX512", "GGML_AVX512_VNNI", "GGML_AVX512_BF16"]
            return "GGML_NATIVE=OFF " + " ".join(f"{k[5:]}={flags[k]}" for k in keys if k in flags)
    return "unknown (no CMakeCache.txt above the binary)"


def run_llama(llama_bench, model, t, pp, tg, reps):
    out = subprocess.run([llama_bench, "-m", str(model), "-t", str(t), "-p", str(pp), "-n", str(tg),
                          "-r", str(reps), "-o", "json"], check=True, capture_output=True, text=True)
    rows = json.loads(out.stdout)
    # A test skipped with `--pp 0` or `--tg 0` has no row: None.
    pick = lambda k: next((r["avg_ts"] for r in rows if r[k] > 0), None)
    return {"pp": pick("n_prompt"), "tg": pick("n_gen")}


def run_corelm(binary, model, t, pp, tg, reps, isa, extra):
    cmd = [str(binary), "bench", "-m", str(model), "-t", str(t), "-p", str(pp), "-n", str(tg),
           "-r", str(reps), "--json", *extra]
    if isa:
        cmd[1:1] = ["--isa", isa]
    out = subprocess.run(cmd, check=True, capture_output=True, text=True)
    rows = [json.loads(l) for l in out.stdout.splitlines() if l.startswith("{")]
    pp_row = next((r for r in rows if r["n_prompt"] > 0), {})
    tg_row = next((r for r in rows if r["n_gen"] > 0), {})
    row = tg_row or pp_row
    return {"pp": pp_row.get("avg_ts"), "tg": tg_row.get("avg_ts"), "roof": tg_row.get("roofline_ts"),
            "kernels": "; ".join(filter(None, [row.get("kernels", "?"), row.get("kernel_variant")]))}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--llama-bench", default=os.environ.get("LLAMA_BENCH"), help="path to llama-bench")
    ap.add_argument("--isa", default="", help="corelm's kernel table (default: the best this CPU runs)")
    ap.add_argument("--threads", default="1,2")
    ap.add_argument("--pp", type=int, default=512)
    ap.add_argument("--tg", type=int, default=128)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--models", default="smollm2,gemma3,qwen2", help="golden model names or GGUF paths")
    ap.add_argument("--corelm-args", default="", help="extra flags for `corelm bench`")
    ap.add_argument("--record", help="append the table, with date, CPU, ISAs and commit, to this file")
    a = ap.parse_args()
    if not a.llama_bench or not Path(a.llama_bench).exists():
        sys.exit("no llama-bench: pass --llama-bench PATH (or LLAMA_BENCH); see this script's docstring")
    subprocess.run(["cargo", "build", "--release", "-q", "-p", "corelm-cli"], cwd=ROOT, check=True)
    binary = ROOT / "target" / "release" / "corelm"
    cpu = next((l.split(":", 1)[1].strip() for l in open("/proc/cpuinfo") if l.startswith("model name")), "?")
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True,
                            text=True).stdout.strip()
    extra = a.corelm_args.split()
    lines, kernels = [], set()
    for name in a.models.split(","):
        model = models_dir() / FILES[name] if name in FILES else Path(name)
        for t in [int(x) for x in a.threads.split(",")]:
            L, C = [], []
            for r in range(a.rounds):
                runs = [lambda: L.append(run_llama(a.llama_bench, model, t, a.pp, a.tg, a.reps)),
                        lambda: C.append(run_corelm(binary, model, t, a.pp, a.tg, a.reps, a.isa, extra))]
                for run in (runs if r % 2 == 0 else runs[::-1]):
                    run()
            kernels.update(c["kernels"] for c in C)
            # Medians over rounds; None where the test was skipped (`--pp 0`, `--tg 0`).
            med = lambda xs, k: statistics.median(x[k] for x in xs) if all(x[k] for x in xs) else None
            lp, cp, lt, ct = med(L, "pp"), med(C, "pp"), med(L, "tg"), med(C, "tg")
            roofs = [c["roof"] for c in C if c["roof"]]
            roof = statistics.median(roofs) if roofs else None
            f1 = lambda v: "–" if v is None else f"{v:.1f}"
            ratio = lambda c, l: "–" if c is None or l is None else f"{c / l:.2f}"
            share = "–" if ct is None or roof is None else f"{100 * ct / roof:.0f} %"
            line = (f"| {name} | {t} | {f1(lp)} | {f1(cp)} | {ratio(cp, lp)} | {f1(lt)} | {f1(ct)} | "
                    f"{ratio(ct, lt)} | {share} |")
            print(line, flush=True)
            lines.append(line)
    head = [
        f"corelm {commit} (kernels: {', '.join(sorted(kernels))}{' ' + a.corelm_args if a.corelm_args else ''}) "
        f"vs llama-bench of llama.cpp 4df29be ({llama_isa(a.llama_bench)}), {cpu}, "
        f"{datetime.date.today()}; pp{a.pp} / tg{a.tg}, {a.reps} reps, median of {a.rounds} alternating rounds.",
        "",
        "| model | threads | llama.cpp pp t/s | corelm pp t/s | pp ratio | llama.cpp tg t/s | corelm tg t/s "
        "| tg ratio | corelm tg / roofline |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    print("\n".join(head + lines))
    if a.record:
        with open(a.record, "a") as f:
            f.write("\n" + "\n".join(head + lines) + "\n")


if __name__ == "__main__":
    main()
