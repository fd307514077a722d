#!/usr/bin/env bash
# A real two-node NUMA check (by hand, not CI): boots a small QEMU guest whose memory is two
# NUMA nodes (`-numa node,...`; TCG software emulation, so no timing means anything) and runs,
# inside it, the topology printout, the placement read-back test (crates/core/tests/numa.rs:
# a buffer bound to each node, an interleaved one over both, checked with move_pages,
# get_mempolicy and /proc/self/numa_maps) and a short SmolLM2 generation under
# `--numa distribute` (repacked weights, pools and KV cache interleaved over both nodes) and
# `--numa isolate` (one worker, memory bound to the starting node) and `--numa tp` (tensor
# parallelism, one shard per node: each shard's worker on its node, its weight copies, KV
# rows and activation regions bound there, the rest interleaved); the guest prints the per-node page counts of those
# mappings by policy, read from the running process's numa_maps.
#
# The guest is Debian's own kernel with an initramfs holding busybox, the two binaries and the
# libraries they link; nothing is installed on the host but shared libraries qemu needs:
# qemu-system-x86 is unpacked into the cache (installing it would remove qemu-utils here).
# Cache: ~/.cache/corelm/qemu. Usage: scripts/numa_qemu.sh [MODEL.gguf]
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
CACHE=${CORELM_QEMU_CACHE:-$HOME/.cache/corelm/qemu}
MODEL=${1:-$HOME/.cache/corelm/models/SmolLM2-135M-Instruct.Q4_1.gguf}
KERNEL_PKG=linux-image-6.1.0-47-cloud-amd64
mkdir -p "$CACHE" && cd "$CACHE"

SUDO=""
[ "$(id -u)" = 0 ] || SUDO=sudo
if [ ! -x root/usr/bin/qemu-system-x86_64 ]; then
    $SUDO apt-get update -qq
    # qemu's shared libraries (plain library packages, safe to install).
    LIBS=$(apt-cache depends qemu-system-x86 | awk '/Depends: lib/ {print $2}')
    $SUDO env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends $LIBS >/dev/null
    apt-get download qemu-system-x86 qemu-system-common qemu-system-data seabios busybox-static "$KERNEL_PKG" 2>/dev/null
    for d in *.deb; do dpkg -x "$d" root; done
fi
QEMU="$CACHE/root/usr/bin/qemu-system-x86_64"
KERNEL=$(ls "$CACHE"/root/boot/vmlinuz-* | head -1)

# The binaries: corelm and the placement test (built without hwloc: the guest reads /sys), in
# a target directory of their own so the main one keeps its features.
cd "$ROOT"
export CARGO_TARGET_DIR=target/numa-guest
cargo build --release -q -p corelm-cli --no-default-features
TEST=$(cargo test --release -p corelm-core --test numa --no-run 2>&1 | grep -o "$CARGO_TARGET_DIR/release/deps/numa-[0-9a-f]*" | head -1)
[ -n "$TEST" ] || { echo "numa_qemu: could not build the placement test" >&2; exit 1; }

# The initramfs: busybox, the binaries, their libraries, the model, an init script.
INITRD=$(mktemp -d)
trap 'rm -rf "$INITRD"' EXIT
mkdir -p "$INITRD"/{bin,proc,sys,dev,tmp,lib64,lib/x86_64-linux-gnu}
cp "$CACHE/root/bin/busybox" "$INITRD/bin/"
for b in sh mount cat grep awk head sed poweroff; do ln -s busybox "$INITRD/bin/$b"; done
cp "$CARGO_TARGET_DIR/release/corelm" "$INITRD/bin/corelm"
cp "$TEST" "$INITRD/bin/numa-test"
for lib in $(ldd "$CARGO_TARGET_DIR/release/corelm" "$TEST" | awk '/=> \// {print $3} /ld-linux/ {print $1}' | sort -u); do
    cp -L "$lib" "$INITRD$lib" 2>/dev/null || { mkdir -p "$INITRD$(dirname "$lib")"; cp -L "$lib" "$INITRD$lib"; }
done
cp "$MODEL" "$INITRD/model.gguf"
cat > "$INITRD/init" <<'INIT'
#!/bin/sh
mount -t proc proc /proc
mount -t sysfs sys /sys
mount -t devtmpfs dev /dev
echo "=== guest: $(cat /sys/devices/system/node/online) nodes online"
corelm topo --sys
echo "=== placement read-back test"
numa-test --nocapture --test-threads 1
echo "=== numa-test exit: $?"
for MODE in distribute isolate tp; do
    echo "=== corelm run --numa $MODE"
    corelm run -m /model.gguf --numa $MODE -n 8 --temp 0 -p "The capital of France is" &
    PID=$!
    sleep 1
    while [ -d /proc/$PID ]; do
        grep -E "interleave|bind" /proc/$PID/numa_maps > /tmp/maps 2>/dev/null && cp /tmp/maps /tmp/last
        sleep 1
    done
    wait $PID
    echo "=== corelm exit: $?; its placed mappings (policy, pages per node) during the run:"
    # Pages per node summed over the mappings of each policy.
    awk '{ for (i = 3; i <= NF; i++) if ($i ~ /^N[0-9]+=/) { split(substr($i, 2), a, "="); n[$2 " N" a[1]] += a[2] } }
         END { for (k in n) print k "=" n[k] }' /tmp/last | sort
    rm -f /tmp/last
done
echo "=== done"
poweroff -f
INIT
chmod +x "$INITRD/init"
(cd "$INITRD" && find . | "$CACHE/root/bin/busybox" cpio -o -H newc 2>/dev/null | gzip -1) > "$CACHE/initrd.gz"

echo "numa_qemu: booting a 2-node guest (TCG; this takes a few minutes)"
QEMU_MODULE_DIR="$CACHE/root/usr/lib/x86_64-linux-gnu/qemu" timeout 1200 "$QEMU" -accel tcg -cpu max -smp 2 -m 3G \
    -object memory-backend-ram,id=m0,size=1536M -object memory-backend-ram,id=m1,size=1536M \
    -numa node,nodeid=0,cpus=0,memdev=m0 -numa node,nodeid=1,cpus=1,memdev=m1 \
    -L "$CACHE/root/usr/share/qemu" -L "$CACHE/root/usr/share/seabios" \
    -kernel "$KERNEL" -initrd "$CACHE/initrd.gz" -append "console=ttyS0 quiet panic=-1" \
    -nic none -nographic -no-reboot | tr -d '\r' | sed -n '/=== guest/,/=== done/p'
