#!/usr/bin/env bash
# Prints the directory holding bookworm-backports' qemu-user (qemu 10: `usr/bin/qemu-aarch64`,
# `usr/bin/qemu-x86_64`), fetched once into ~/.cache/corelm/qemu-backports with an apt of its
# own: nothing is installed. Debian 12's own qemu-user-static (7.2) computes SME's 8-bit outer
# products and some AVX2 results wrongly (scripts/test_arm.sh, scripts/test_avx2_cpu.sh).
set -euo pipefail
QDIR="${XDG_CACHE_HOME:-$HOME/.cache}/corelm/qemu-backports"
if [ ! -x "$QDIR/usr/bin/qemu-aarch64" ] || [ ! -x "$QDIR/usr/bin/qemu-x86_64" ]; then
    echo "qemu_backports: fetching qemu-user from bookworm-backports into $QDIR" >&2
    tmp=$(mktemp -d)
    mkdir -p "$tmp/lists/partial" "$tmp/cache/archives/partial" "$QDIR"
    echo "deb [signed-by=/usr/share/keyrings/debian-archive-keyring.gpg] http://deb.debian.org/debian bookworm-backports main" > "$tmp/sources.list"
    APT=(-o "Dir::Etc::SourceList=$tmp/sources.list" -o Dir::Etc::SourceParts=/dev/null -o "Dir::State::Lists=$tmp/lists" -o "Dir::Cache=$tmp/cache")
    apt-get "${APT[@]}" update -qq >&2
    (cd "$tmp" && apt-get "${APT[@]}" download -qq qemu-user 2>/dev/null >&2)
    dpkg-deb -x "$tmp"/qemu-user_*.deb "$QDIR"
    rm -rf "$tmp"
fi
echo "$QDIR"
