#!/usr/bin/env bash
# The many-core measurements the ArcLight and Sandwich issues ask of a lent machine (issue 16
# item 8: thread scaling 1→N and TP 1/2/4 there, with lscpu's and hwloc's view of its nodes;
# issue 17 item 7: the prefill/decode configuration `corelm tune` chooses there), in one call
# of the `device` tool, which carries at most 64 MiB and has no Rust (DEVELOPERS.md).
#
#   scripts/device_scaling.sh pack       # here: .dev/corelm.xz, two shrunk models (47 MB), and
#                                        # the Vulkan loaders as .debs in .gl/ (the device README)
#   scripts/device_scaling.sh measure    # there (or here, to try it): tables in $OUT/scaling.md
#
# The device call: `run` with carry [".dev", ".gl"], command `bash scripts/device_scaling.sh
# measure`, timeout_s 540. With a GPU (Vulkan found once .gl's loaders are unpacked), also
# `corelm profile --accel`, Qwen2.5 / SmolLM2 with `--accel-layers` (none, half, all), and
# pp512 with the profile's plan on the CPU alone and with `--accel-split`. Every step runs under `timeout`, so a slow one costs its own figure only;
# the log says which. The models are shrunk (scripts/device_model.py: real shapes, types and
# blocks, repeated rows), so the figures are speed only. Threads: 1, 2, 4, … up to the
# machine's cores (nproc), then nproc itself; TP 1, 2, 4 at nproc threads.
set -uo pipefail
cd "$(dirname "$0")/.."
DEV=.dev
MODELS=${CORELM_MODELS:-$HOME/.cache/corelm/models}
SMOL=SmolLM2-135M-Instruct.Q4_1.gguf
QWEN=qwen2.5-coder-0.5b-instruct-awq-q4_k_m.gguf

pack() {
    set -e
    cargo build --release -p corelm-cli
    mkdir -p "$DEV"
    strip -o "$DEV/corelm" target/release/corelm
    xz -9 -f "$DEV/corelm"
    for m in "$SMOL" "$QWEN"; do
        python3 scripts/device_model.py shrink "$MODELS/$m" "$DEV/$m.tiled" --keep 16
    done
    # The Vulkan loaders the device machine lacks (its README), amd64 whatever this machine is.
    if ! ls .gl/*.deb > /dev/null 2>&1; then
        grep -qx '/.gl/' .git/info/exclude 2> /dev/null || echo /.gl/ >> .git/info/exclude
        mkdir -p .gl /tmp/amd64/partial
        local o='-oAPT::Architecture=amd64 -oAPT::Architectures=amd64 -oDir::State::Lists=/tmp/amd64'
        apt-get $o update -qq
        (cd .gl && apt-get $o download libvulkan1 libegl1 libglvnd0 libopengl0 libgl1 libglx0 libgles2)
    fi
    du -sh "$DEV" .gl
}

measure() {
    local out=${OUT:-/tmp/device_scaling}
    mkdir -p "$out"
    local log="$out/scaling.md" bin=/tmp/corelm-dev/corelm dir=/tmp/corelm-dev
    mkdir -p "$dir"
    if [ -f "$DEV/corelm.xz" ]; then
        xz -dc "$DEV/corelm.xz" > "$bin" && chmod +x "$bin"
    else
        cp target/release/corelm "$bin"
    fi
    local m models=()
    for m in "$SMOL" "$QWEN"; do
        if [ -f "$DEV/$m.tiled" ]; then
            timeout 120 python3 scripts/device_model.py expand "$DEV/$m.tiled" "$dir/$m" && models+=("$dir/$m")
        elif [ -f "$MODELS/$m" ]; then
            models+=("$MODELS/$m")
        fi
    done
    local n; n=$(nproc)
    local threads=() t=1
    while [ "$t" -lt "$n" ]; do threads+=("$t"); t=$((t * 2)); done
    threads+=("$n")
    {
        echo "# corelm on $(hostname): $(date -u +%FT%TZ)"
        echo
        echo '```'
        lscpu | grep -E '^(Model name|CPU\(s\)|Thread|Core|Socket|NUMA|L[23])' || true
        grep -o -E 'avx512[a-z_0-9]*|amx[a-z_0-9]*|avx_vnni' /proc/cpuinfo | sort -u | tr '\n' ' '; echo
        timeout 30 "$bin" topo 2>&1 | head -40
        echo '```'
    } > "$log"
    step() {  # step SECONDS ARGS...: one bench, its table rows into the log
        local s=$1; shift
        echo "## corelm bench $*" >> "$log"
        if ! timeout "$s" "$bin" bench "$@" 2>&1 | grep -E '^\||aggregate|waits|accel-layers|accel-split|^\[' >> "$log"; then
            echo "(failed or timed out after ${s} s)" >> "$log"
        fi
    }
    for m in "${models[@]}"; do
        for t in "${threads[@]}"; do
            step 90 -m "$m" -p 512 -n 128 -r 2 -t "$t"
        done
        for tp in 2 4; do
            [ "$tp" -le "$n" ] && step 90 -m "$m" -p 512 -n 128 -r 2 -t "$n" --tp "$tp"
        done
    done
    # The accelerator, where there is a GPU: its roofline figures, then whole layers on it.
    if ls .gl/*.deb > /dev/null 2>&1 && { command -v nvidia-smi > /dev/null || [ -d /usr/local/nvidia ]; }; then
        for f in .gl/*.deb; do dpkg -x "$f" /; done
        ldconfig
        export VK_DRIVER_FILES=/usr/local/nvidia/share/vulkan/icd.d/nvidia_icd.json
        echo "## corelm profile --accel" >> "$log"
        timeout 120 "$bin" profile --accel -o "$out/profile.json" 2>&1 | grep -E 'accel|wgsl|read|together' >> "$log" \
            || echo "(profile --accel failed or timed out)" >> "$log"
        for m in "${models[@]}"; do
            local layers
            layers=$(case "$m" in *qwen*) echo "0 12 24" ;; *) echo "0 15 30" ;; esac)
            for l in $layers; do
                step 120 -m "$m" -p 512 -n 128 -r 2 -t "$n" --accel-layers "$l"
            done
            # Issue 18's split (SMEPilot): prefill matmuls cut between the CPU and the device
            # as the profile's roofline places them, against the same plan on the CPU alone
            # (the device alone is --accel-layers with every layer, above).
            if [ -f "$out/profile.json" ]; then
                step 120 -m "$m" -p 512 -n 0 -r 2 -t "$n" --roofline "$out/profile.json"
                step 120 -m "$m" -p 512 -n 0 -r 2 -t "$n" --roofline "$out/profile.json" --accel-split
            fi
        done
    fi
    # Sandwich's configuration choice on this machine (SmolLM2).
    if [ "${#models[@]}" -gt 0 ]; then
        echo "## corelm tune -m $(basename "${models[0]}")" >> "$log"
        timeout 150 "$bin" tune -m "${models[0]}" -o "$out/plan.json" 2>&1 | grep -v '^\s*$' | tail -25 >> "$log" \
            || echo "(tune failed or timed out)" >> "$log"
    fi
    cat "$log"
}

case "${1:-measure}" in
    pack) pack ;;
    measure) measure ;;
    *) echo "usage: $0 pack|measure" >&2; exit 2 ;;
esac
