#!/usr/bin/env bash
# aarch64, emulated: cross-build the kernel parity tests and real-model golden checks
# (SmolLM2's first case, prompt logits within tolerance; Gemma 3's first case for the K-quant
# kernels, under neoverse-n1 only; SmolLM2 requantized to F16, the
# AVX-512 table's logits bit for bit) for aarch64-unknown-linux-gnu and run
# them under qemu-user with several CPU models, so every dispatch path a real ARM CPU can take
# runs: `max` (dotprod, i8mm, SVE, SME), `neoverse-n1` (dotprod, no i8mm), `cortex-a53` (no
# dotprod). Correctness only: emulated timings mean nothing.
#
# SME: Debian 12's qemu 7.2 computes SME's 8-bit outer products into 32-bit tiles (`SUMOPA`)
# wrongly, so under its `-cpu max` the start-up self-test refuses the SME table (the tests
# check that it does). The SME kernels themselves run under bookworm-backports' qemu 10
# (its static `qemu-aarch64`, fetched once into ~/.cache/corelm/qemu-backports by
# scripts/qemu_backports.sh, nothing installed), at streaming vectors of 512 and 256 bits, where
# CORELM_EXPECT_SME=1 makes the tests fail unless the SME table is granted.
#
# What it needs is installed here if missing (Debian 12; rustup's downloads are not reachable):
# Debian's second Rust toolchain with an arm64 standard library (rustc-web, cargo-web,
# libstd-rust-web-dev:arm64), the cross linker and qemu-user-static.
set -euo pipefail
cd "$(dirname "$0")/.."

T=aarch64-unknown-linux-gnu
# The arm64 libraries qemu loads: the multiarch libc6:arm64 (pulled in by libstd-rust-web-dev)
# with its own ld.so, not the cross sysroot /usr/aarch64-linux-gnu: that ld.so (2.36-8cross1)
# with the multiarch libc.so.6 (2.36-9+deb12u*), which qemu finds first, loops forever in the
# first pthread_create.
SYSROOT=/
PKGS="rustc-web cargo-web libstd-rust-web-dev:arm64 gcc-aarch64-linux-gnu libc6-dev-arm64-cross qemu-user-static"

if ! dpkg -s $PKGS >/dev/null 2>&1; then
    SUDO=""
    [ "$(id -u)" = 0 ] || SUDO=sudo
    echo "test_arm: installing $PKGS"
    $SUDO dpkg --add-architecture arm64
    $SUDO apt-get update -qq
    $SUDO env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends $PKGS >/dev/null
fi

# Debian's toolchain (not rustup's, which has no arm64 standard library here), its own target
# directory, no debug info (faster links), the cross linker.
export RUSTC=/usr/bin/rustc
export CARGO_TARGET_DIR=target/aarch64-cross
export CARGO_PROFILE_RELEASE_DEBUG=0
export CARGO_TARGET_AARCH64_UNKNOWN_LINUX_GNU_LINKER=aarch64-linux-gnu-gcc
CARGO=/usr/bin/cargo
TESTS=(-p corelm-kernels --test parity --test ggml_fixture --test interleave --test dense_dots --test sme --test matrix_attention --test sparse --lib)
GOLDEN=(-p corelm-engine --test golden)
# SmolLM2 requantized to F16: the AVX-512 table's logits bit for bit (a hash).
F16=(-p corelm-engine --test quantize)

"$CARGO" test --release --target $T "${TESTS[@]}" --no-run
"$CARGO" test --release --target $T "${GOLDEN[@]}" --no-run
"$CARGO" test --release --target $T "${F16[@]}" --no-run
for cpu in max neoverse-n1 cortex-a53; do
    echo "test_arm: qemu-aarch64 -cpu $cpu"
    export CARGO_TARGET_AARCH64_UNKNOWN_LINUX_GNU_RUNNER="qemu-aarch64-static -L $SYSROOT -cpu $cpu"
    "$CARGO" test --release --target $T "${TESTS[@]}" -q
    # SmolLM2 on each table once (a table's run takes 1.5 minutes emulated): the sdot table
    # under max (with i8mm: its panel GEMM on `usmmla`) and under neoverse-n1 (on `sdot`), the
    # portable and NEON tables under cortex-a53, the only CPU model without sdot.
    case $cpu in
        cortex-a53) ISAS=portable,neon ;;
        *) ISAS=dotprod ;;
    esac
    CORELM_GOLDEN_ISAS=$ISAS "$CARGO" test --release --target $T "${GOLDEN[@]}" -q golden_smollm2_p01 -- --exact --nocapture
    if [ "$cpu" = neoverse-n1 ]; then
        # The K-quant kernels on a real model (Gemma 3's Q4_K/Q6_K/Q5_0/Q8_0 matrices) under
        # the NEON and sdot tables: once, on the CPU model that has both (~5 minutes).
        "$CARGO" test --release --target $T "${GOLDEN[@]}" -q golden_gemma3_p01 -- --exact --nocapture
        # Each MoE expert as a dense matmul on the NEON and sdot tables' tiles (same bits).
        "$CARGO" test --release --target $T -p corelm-core --test experts -q
    fi
    "$CARGO" test --release --target $T "${F16[@]}" -q f16_model_gives_the_avx512_tables_logits -- --exact --nocapture
done

QDIR=$(bash scripts/qemu_backports.sh)
QEMU_SME="$QDIR/usr/bin/qemu-aarch64"
export CORELM_EXPECT_SME=1
for vl in 32 64; do
    echo "test_arm: $("$QEMU_SME" --version | head -1) -cpu max,sme-default-vector-length=$vl"
    export CARGO_TARGET_AARCH64_UNKNOWN_LINUX_GNU_RUNNER="$QEMU_SME -L $SYSROOT -cpu max,sme-default-vector-length=$vl"
    "$CARGO" test --release --target $T "${TESTS[@]}" -q
    # A panel GEMM split between the matrix unit's workers and the vector cores' (same bits).
    "$CARGO" test --release --target $T -p corelm-core --test class_split -q
    "$CARGO" test --release --target $T -p corelm-engine --test classes -q
done
"$CARGO" test --release --target $T -p corelm-plan --test profile -q
# The SME table on the real model (its tiles and panel GEMM); the portable, NEON and sdot
# tables' golden checks ran under the CPU models above.
CORELM_GOLDEN_ISAS=sme "$CARGO" test --release --target $T "${GOLDEN[@]}" -q golden_smollm2_p01 -- --exact --nocapture
