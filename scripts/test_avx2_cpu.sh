#!/usr/bin/env bash
# An x86-64 CPU with AVX2 and no AVX-512 (a Zen 3 or Haswell-class machine), emulated:
# qemu-user's `-cpu max` has AVX2, FMA and F16C but no AVX-512, so the kernels' run-time
# detection picks the AVX2 table by itself (not through `--isa avx2`), and an AVX-512
# instruction left in an AVX2 path stops the run (SIGILL). Under it: the kernel parity tests
# (every SIMD kernel against its portable twin) and the kernels' unit tests, then per model in
# the cache a greedy generation, with and without `--fast-prefill` (the panel GEMM), whose
# text must equal the native `--isa avx2` run's. Correctness only: emulated timings mean
# nothing.
#
# qemu 10 (bookworm-backports, scripts/qemu_backports.sh): under Debian 12's qemu 7.2, the
# first with AVX2 in TCG, 7 of the 29 parity tests fail (attention and GEGLU bits differ),
# where qemu 10 and real CPUs pass all of them.
set -euo pipefail
cd "$(dirname "$0")/.."
# Detection decides here, not an inherited override.
unset CORELM_ISA
QEMU="$(bash scripts/qemu_backports.sh)/usr/bin/qemu-x86_64"
echo "test_avx2_cpu: $("$QEMU" --version | head -1) -cpu max"

export CARGO_TARGET_X86_64_UNKNOWN_LINUX_GNU_RUNNER="$QEMU -cpu max"
cargo test --release -q -p corelm-kernels --lib --test parity
unset CARGO_TARGET_X86_64_UNKNOWN_LINUX_GNU_RUNNER

cargo build --release -q -p corelm-cli
BIN=target/release/corelm
MODELS="${CORELM_MODELS_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/corelm/models}"
PROMPT="The capital of France is"
ERR=$(mktemp)
trap 'rm -f "$ERR"' EXIT
ran=0
for m in SmolLM2-135M-Instruct.Q4_1 gemma-3-270m-q4_k_m qwen2.5-coder-0.5b-instruct-awq-q4_k_m; do
    M="$MODELS/$m.gguf"
    [ -f "$M" ] || { echo "test_avx2_cpu: $m not in $MODELS, skipped"; continue; }
    for fast in "" --fast-prefill; do
        want=$("$BIN" run -m "$M" --isa avx2 --temp 0 -n 16 $fast -p "$PROMPT" 2>/dev/null)
        got=$("$QEMU" -cpu max "$BIN" run -m "$M" --temp 0 -n 16 $fast -p "$PROMPT" 2>"$ERR")
        table=$(grep -o '[a-z0-9]* kernels' "$ERR" | tail -1)
        if [ "$table" != "avx2 kernels" ]; then
            echo "test_avx2_cpu: $m ${fast:-(default)}: the emulated CPU ran '$table', not the AVX2 table" >&2
            cat "$ERR" >&2
            exit 1
        fi
        if [ "$got" != "$want" ]; then
            echo "test_avx2_cpu: $m ${fast:-(default)}: the AVX2-only CPU's text differs from --isa avx2's" >&2
            printf 'native:   %s\nemulated: %s\n' "$want" "$got" >&2
            exit 1
        fi
        echo "test_avx2_cpu: $m ${fast:-(default)}: same text on the AVX2-only CPU as with --isa avx2"
        ran=$((ran + 1))
    done
done
[ "$ran" -gt 0 ] || { echo "test_avx2_cpu: no model found in $MODELS" >&2; exit 1; }
