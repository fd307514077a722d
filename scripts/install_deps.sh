#!/usr/bin/env bash
# The system libraries the default build links: hwloc (the hardware topology, through the
# `hwlocality` crate) and libudev, which hwloc's pkg-config file names; and a Vulkan loader
# with Mesa's drivers (software lavapipe among them), which the accelerator backend's tests
# (crates/accel, `--accel-mem`) run on when the machine has no GPU driver. Installed with apt
# (root or sudo) when missing; a no-op otherwise. Without hwloc, build with
# `cargo build --release --no-default-features -p corelm-cli`: the topology then comes from /sys.
set -euo pipefail

PKGS=""
if ! (pkg-config --exists hwloc 2>/dev/null && pkg-config --exists libudev 2>/dev/null); then
    PKGS="libhwloc-dev libudev-dev pkg-config"
fi
if ! (ldconfig -p | grep -q 'libvulkan\.so\.1' && ls /usr/share/vulkan/icd.d/*.json >/dev/null 2>&1); then
    PKGS="$PKGS libvulkan1 mesa-vulkan-drivers"
fi
[ -n "$PKGS" ] || exit 0
SUDO=""
[ "$(id -u)" = 0 ] || SUDO=sudo
echo "install_deps: installing $PKGS"
$SUDO apt-get update -qq
$SUDO env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends $PKGS >/dev/null
