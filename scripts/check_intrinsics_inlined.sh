#!/usr/bin/env bash
# Every x86 SIMD intrinsic inlined into its kernel: no `core::core_arch::x86::<feature>::_mm…`
# function left out of line in the release `corelm` binary.
#
# An intrinsic is inlined only into a function compiled with its target features. A kernel's
# `#[inline(always)]` helpers inherit them, but a closure does not: when LLVM leaves an
# `array::from_fn`/`map` closure out of line, every intrinsic in it becomes a call. That
# made the AVX2 Q5_0 GEMV 30x slower once (8.2 -> 277 ms per token) with every test green;
# the kernels now use loops there. Run by `make test` after the release build.
set -euo pipefail
cd "$(dirname "$0")/.."
BIN=target/release/corelm
[ -x "$BIN" ] || cargo build --release -q -p corelm-cli
# `xsave::_xgetbv` is the feature detection itself (called once), not a kernel's intrinsic.
LEFT=$(nm -C "$BIN" | grep -E ' core::core_arch::x86(_64)?::[a-z0-9_]+::_' | grep -v '::xsave::_xgetbv' || true)
if [ -n "$LEFT" ]; then
    echo "check_intrinsics_inlined: intrinsics left out of line in $BIN (a closure or helper without the kernel's target features calls them):"
    echo "$LEFT" | head -20
    exit 1
fi
echo "check_intrinsics_inlined: no x86 intrinsic out of line in $BIN"
