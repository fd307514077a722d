#!/usr/bin/env bash
# The system libraries the default build links: hwloc (the hardware topology, through the
# `hwlocality` crate) and libudev, which hwloc's pkg-config file names. Installed with apt
# (root or sudo) when pkg-config cannot find hwloc; a no-op otherwise. Without them, build with
# `cargo build --release --no-default-features -p corelm-cli`: the topology then comes from /sys.
set -euo pipefail

if pkg-config --exists hwloc 2>/dev/null && pkg-config --exists libudev 2>/dev/null; then
    exit 0
fi
PKGS="libhwloc-dev libudev-dev pkg-config"
SUDO=""
[ "$(id -u)" = 0 ] || SUDO=sudo
echo "install_deps: installing $PKGS"
$SUDO apt-get update -qq
$SUDO env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends $PKGS >/dev/null
