#!/usr/bin/env bash
# The measurements the issues ask of a lent machine, in one call of the `device` tool, which
# carries at most 64 MiB and has no Rust (DEVELOPERS.md): issue 16 item 8 (thread scaling 1→N
# and TP 1/2/4, both synchronisations, with lscpu's and hwloc's view of its nodes), issue 17
# item 7 (the configuration `corelm tune` chooses there), and with a GPU issues 18 and 19
# (`corelm profile --accel`; whole layers on the device with `--accel-layers`; prefill matmuls
# split with it, `--accel-split`). llama.cpp's llama-bench runs beside corelm in the same call.
#
#   scripts/device_scaling.sh pack       # here: .dev/ (corelm and llama-bench, xz; two models
#                                        # shrunk to 19 MB) and the Vulkan loaders in .gl/.
#                                        # BASE=<rev> also builds that revision, run beside.
#   scripts/device_scaling.sh measure    # there: $OUT/scaling.md (summary), $OUT/raw.log
#
# The device call: `run` with carry [".dev", ".gl"], command `bash scripts/device_scaling.sh
# measure`, timeout_s about BUDGET + 60. SECTIONS selects (default "info roofline gpu hybrid vk
# budget batched tp threads llama tune"; the order is the script's), THREADS the thread counts
# (1,4,16); BUDGET (seconds, default 500) is a deadline every step's `timeout` is cut to, so
# the call ends in time and a slow step costs its own figure only.
# The models are shrunk (scripts/device_model.py: real shapes, types and blocks, repeated
# rows), so the figures are speed only. Threads: 1, 2, 4, … up to nproc, then nproc itself.
# ACCEL_LOCAL=1 runs the GPU section on whatever Vulkan device this machine has (lavapipe).
set -uo pipefail
cd "$(dirname "$0")/.."
DEV=.dev
MODELS=${CORELM_MODELS:-$HOME/.cache/corelm/models}
SMOL=SmolLM2-135M-Instruct.Q4_1.gguf
QWEN=qwen2.5-coder-0.5b-instruct-awq-q4_k_m.gguf
# Heads of 256 (the device's attention tiles of 4 threads a row): the gpu section only.
GEMMA=gemma-3-270m-q4_k_m.gguf

pack() {
    set -e
    cargo build --release -p corelm-cli
    mkdir -p "$DEV"
    strip -o "$DEV/corelm" target/release/corelm
    xz -9 -f "$DEV/corelm"
    for m in "$SMOL" "$QWEN" "$GEMMA"; do
        python3 scripts/device_model.py shrink "$MODELS/$m" "$DEV/$m.tiled" --keep 64
    done
    # The Vulkan loaders the device machine lacks (its README), amd64 whatever this machine is.
    if ! ls .gl/*.deb > /dev/null 2>&1; then
        grep -qx '/.gl/' .git/info/exclude 2> /dev/null || echo /.gl/ >> .git/info/exclude
        mkdir -p .gl /tmp/amd64/partial
        local o='-oAPT::Architecture=amd64 -oAPT::Architectures=amd64 -oDir::State::Lists=/tmp/amd64'
        apt-get $o update -qq
        (cd .gl && apt-get $o download libvulkan1 libegl1 libglvnd0 libopengl0 libgl1 libglx0 libgles2)
    fi
    # llama.cpp's llama-bench (4df29be, static, built outside the repo: LLAMA_BUILD=DIR with
    # b-avx2/, b-avx512/ and b-vk/ (Vulkan) under it), and the libgomp it links.
    local v b=${LLAMA_BUILD:-/work/llama}
    local tool
    for v in avx2 avx512 vk; do
        for tool in llama-bench llama-batched-bench; do
            if [ -x "$b/b-$v/bin/$tool" ]; then
                strip -o "$DEV/$tool-$v" "$b/b-$v/bin/$tool"
                xz -9 -f "$DEV/$tool-$v"
            fi
        done
    done
    # The shared libraries corelm (hwloc, udev) and llama-bench (libgomp, OpenSSL) link, for a machine
    # without them (`measure` uses each only where the machine lacks it).
    mkdir -p "$DEV/lib"
    local lib
    for lib in libhwloc.so.15 libudev.so.1 libgomp.so.1 libssl.so.3 libcrypto.so.3; do
        cp -L "$(ldconfig -p | awk -v l="$lib" '$1 == l && /x86-64/ {print $NF; exit}')" "$DEV/lib/"
    done
    # BASE=<rev>: that revision's corelm too, to set beside this one in the same run.
    if [ -n "${BASE:-}" ]; then
        rm -rf /tmp/corelm-base && git worktree add -f /tmp/corelm-base "$BASE"
        (cd /tmp/corelm-base && CARGO_TARGET_DIR=$PWD/../corelm-base-target cargo build --release -p corelm-cli)
        strip -o "$DEV/corelm-base" /tmp/corelm-base-target/release/corelm
        xz -9 -f "$DEV/corelm-base"
        git worktree remove --force /tmp/corelm-base
    fi
    du -sh "$DEV" .gl
}

measure() {
    local out=${OUT:-/tmp/device_scaling}
    mkdir -p "$out"
    local log="$out/scaling.md" raw="$out/raw.log" dir=/tmp/corelm-dev
    local bin=$dir/corelm
    mkdir -p "$dir"
    local deadline=$((SECONDS + ${BUDGET:-500}))
    local sections=" ${SECTIONS:-info roofline gpu hybrid vk budget batched tp threads llama tune} "
    # The carried libraries this machine lacks.
    mkdir -p "$dir/lib"
    local lib
    for lib in "$DEV"/lib/*; do
        [ -f "$lib" ] || continue
        ldconfig -p | grep -q "^\s*$(basename "$lib") " || cp "$lib" "$dir/lib/"
    done
    export LD_LIBRARY_PATH=$dir/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
    if [ -f "$DEV/corelm.xz" ]; then
        xz -dc "$DEV/corelm.xz" > "$bin" && chmod +x "$bin"
    else
        cp target/release/corelm "$bin"
    fi
    # A second build to set beside the first in the same run (BASE: `pack` with BASE=<rev>).
    local base=""
    if [ -f "$DEV/corelm-base.xz" ]; then
        base=$dir/corelm-base
        xz -dc "$DEV/corelm-base.xz" > "$base" && chmod +x "$base"
    fi
    local m models=() gpu_models=()
    for m in "$SMOL" "$QWEN" "$GEMMA"; do
        if [ -f "$DEV/$m.tiled" ]; then
            timeout 120 python3 scripts/device_model.py expand "$DEV/$m.tiled" "$dir/$m" && gpu_models+=("$dir/$m")
        elif [ -f "$MODELS/$m" ]; then
            gpu_models+=("$MODELS/$m")
        fi
    done
    for m in "${gpu_models[@]}"; do
        [[ "$m" == *"$GEMMA" ]] || models+=("$m")
    done
    local n; n=$(nproc)
    local threads=() t=1
    while [ "$t" -lt "$n" ]; do threads+=("$t"); t=$((t * 2)); done
    threads+=("$n")
    [ -n "${THREADS:-}" ] && IFS=, read -r -a threads <<< "$THREADS"
    # unxz NAME: the carried $DEV/NAME.xz unpacked to $dir/NAME.
    unxz() {
        xz -dc "$DEV/$1.xz" > "$dir/$1" && chmod +x "$dir/$1"
    }
    # unpack TOOL: llama.cpp's TOOL built for this CPU's widest table, its path in $tool ("" if none).
    unpack() {
        tool=""
        local v
        for v in avx512 avx2; do
            [ "$v" = avx512 ] && ! grep -q avx512_vnni /proc/cpuinfo && continue
            if [ -f "$DEV/$1-$v.xz" ]; then
                unxz "$1-$v" && tool=$dir/$1-$v
                return
            fi
        done
    }
    local tool llama batched
    unpack llama-bench; llama=$tool
    unpack llama-batched-bench; batched=$tool
    has() { [[ "$sections" == *" $1 "* ]]; }
    layers_of() { case "$1" in *qwen*) echo 24 ;; *gemma*) echo 18 ;; *) echo 30 ;; esac; }  # MODEL: its layers
    left() { echo $((deadline - SECONDS)); }
    {
        echo "# corelm on $(hostname): $(date -u +%FT%TZ), sections:$sections"
        echo
        echo '```'
        lscpu | grep -E '^(Model name|CPU\(s\)|Thread|Core|Socket|NUMA|L[23])' || true
        grep -o -E 'avx512[a-z_0-9]*|amx[a-z_0-9]*|avx_vnni' /proc/cpuinfo | sort -u | tr '\n' ' '; echo
        command -v nvidia-smi > /dev/null && nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
        has info && timeout 30 "$bin" topo 2>&1 | head -40
        echo '```'
    } > "$log"
    # run SECONDS TITLE FILTER CMD...: one command under `timeout` (cut to the time left before
    # the deadline, skipped under 15 s), its whole output into raw.log and FILTER's lines
    # (an extended regex) into the summary.
    run() {
        local s=$1 title=$2 filter=$3; shift 3
        local l; l=$(left)
        [ "$s" -gt "$l" ] && s=$l
        echo "## $title" >> "$log"
        if [ "$s" -lt 15 ]; then
            echo "(skipped: ${l} s left)" >> "$log"
            return
        fi
        echo "### $title ($(date -u +%T), limit $s s)" >> "$raw"
        local t0=$SECONDS
        timeout "$s" "$@" > "$dir/step.log" 2>&1
        local rc=$?
        cat "$dir/step.log" >> "$raw"
        grep -E "$filter" "$dir/step.log" >> "$log"
        [ "$rc" -ne 0 ] && echo "(exit $rc after $((SECONDS - t0)) s)" >> "$log"
    }
    local rows='^\||aggregate|accel-layers|accel-split|^\['
    step() {  # step SECONDS ARGS...: one `corelm bench`
        local s=$1; shift
        run "$s" "corelm bench $*" "$rows" "$bin" bench "$@"
    }
    gpu=false
    if ls .gl/*.deb > /dev/null 2>&1 && { command -v nvidia-smi > /dev/null || [ -d /usr/local/nvidia ]; }; then
        for f in .gl/*.deb; do dpkg -x "$f" /; done
        ldconfig
        export VK_DRIVER_FILES=/usr/local/nvidia/share/vulkan/icd.d/nvidia_icd.json
        gpu=true
    elif [ -n "${ACCEL_LOCAL:-}" ]; then
        gpu=true  # trying the script here, on whatever Vulkan device this machine has
    fi
    # The accelerator (issues 18 and 19): its roofline figures, whole layers on it for decode
    # and prefill, and prefill matmuls split between it and the CPU as the profile places them.
    if has gpu && $gpu; then
        has roofline && run 150 "corelm profile --accel" 'accel|wgsl|read|together|int8|device|link' \
            "$bin" profile --accel -o "$out/profile.json"
        for m in "${gpu_models[@]}"; do
            local all; all=$(layers_of "$m")
            step 60 -m "$m" -p 512 -n 64 -r 2 -t "$n"
            step 60 -m "$m" -p 512 -n 64 -r 2 -t "$n" --accel-layers "$all"
            [ -n "$base" ] && run 60 "base: corelm bench -m $m --accel-layers $all" "$rows" \
                "$base" bench -m "$m" -p 512 -n 64 -r 2 -t "$n" --accel-layers "$all"
            # Where a decode token and a 512-token prompt on the device go (recording, waiting,
            # and the device's clock per kind of dispatch).
            run 60 "corelm bench --profile --accel-layers $all (decode)" 'device|^\|' \
                "$bin" bench -m "$m" -p 0 -n 32 -r 1 -t "$n" --accel-layers "$all" --profile
            run 60 "corelm bench --profile --accel-layers $all (prefill)" 'device|^\|' \
                "$bin" bench -m "$m" -p 512 -n 0 -r 1 -t "$n" --accel-layers "$all" --profile
            if [ -f "$out/profile.json" ]; then
                step 60 -m "$m" -p 512 -n 0 -r 2 -t "$n" --roofline "$out/profile.json" --accel-split
            fi
        done
    fi
    # Prefill on the device, decode on the CPU (`--accel-min-tokens`), beside each alone.
    if has hybrid && $gpu; then
        for m in "${models[@]}"; do
            local all; all=$(layers_of "$m")
            step 60 -m "$m" -p 128,512 -n 128 -r 2 -t "$n"
            step 60 -m "$m" -p 128,512 -n 128 -r 2 -t "$n" --accel-layers "$all"
            step 60 -m "$m" -p 128,512 -n 128 -r 2 -t "$n" --accel-layers "$all" --accel-min-tokens 32
        done
    fi
    # llama.cpp's Vulkan build on the same GPU: no layers there, half of them, all of them.
    if has vk && $gpu && [ -f "$DEV/llama-bench-vk.xz" ]; then
        unxz llama-bench-vk
        for m in "${models[@]}"; do
            local half=$(($(layers_of "$m") / 2))
            for ngl in 0 "$half" 99; do
                run 60 "llama-bench (Vulkan) -m $(basename "$m") -ngl $ngl" '^\||ggml_vulkan: 0' \
                    "$dir/llama-bench-vk" -m "$m" -p 128,512 -n 128 -r 2 -t "$n" -ngl "$ngl"
            done
        done
    fi
    # The device holding half the layers' bytes (issue 19 item 8: llama.cpp's -ngl at the same
    # budget): those layers whole, then the same bytes of feed-forward weights (`--accel-mem`).
    if has budget && $gpu; then
        for m in "${models[@]}"; do
            local half=$(($(layers_of "$m") / 2))
            step 60 -m "$m" -p 128,512 -n 128 -r 2 -t "$n" --accel-layers "$half"
            local mb; mb=$(grep -o -E '[0-9.]+ MB of weights' "$dir/step.log" | head -1 | cut -d' ' -f1)
            [ -n "$mb" ] && step 60 -m "$m" -p 128,512 -n 128 -r 2 -t "$n" --accel-mem "${mb%.*}M"
        done
    fi
    # Batched decode (issue 17 item 6): B sequences of a 128-token prompt each, then 64 decode
    # steps of one token per sequence, at every core, beside llama-batched-bench; then every
    # layer on the device, where a step's rows share each weight read.
    if has batched; then
        local batched_vk=""
        if $gpu && [ -f "$DEV/llama-batched-bench-vk.xz" ]; then
            unxz llama-batched-bench-vk && batched_vk=$dir/llama-batched-bench-vk
        fi
        for m in "${models[@]}"; do
            local all; all=$(layers_of "$m")
            step 90 -m "$m" -p 128 -n 64 -r 2 -t "$n" --npl 1,4,16
            [ -n "$batched" ] && run 90 "llama-batched-bench -m $(basename "$m") -npl 1,4,16" '^\|' \
                "$batched" -m "$m" -c 8192 -b 512 -ub 512 -fa on -npp 128 -ntg 64 -npl 1,4,16 -t "$n" -tb "$n"
            $gpu && step 60 -m "$m" -p 128 -n 64 -r 2 -t "$n" --npl 1,4,16 --accel-layers "$all"
            if [ -n "$batched_vk" ]; then
                run 90 "llama-batched-bench (Vulkan) -m $(basename "$m") -ngl 99 -npl 1,4,16" '^\|' \
                    "$batched_vk" -m "$m" -c 8192 -b 512 -ub 512 -fa on -npp 128 \
                    -ntg 64 -npl 1,4,16 -t "$n" -tb "$n" -ngl 99
            fi
        done
    fi
    # Tensor parallelism at every core (issue 16): TP 1, 2, 4, both synchronisations.
    if has tp; then
        for m in "${models[@]}"; do
            step 40 -m "$m" -p 512 -n 128 -r 2 -t "$n"
            for tp in 2 4; do
                [ "$tp" -le "$n" ] || continue
                step 40 -m "$m" -p 512 -n 128 -r 2 -t "$n" --tp "$tp"
                step 40 -m "$m" -p 512 -n 128 -r 2 -t "$n" --tp "$tp" --tp-sync lockstep
            done
        done
    fi
    # Thread scaling 1 → nproc, and llama.cpp beside it in the same run.
    if has threads; then
        for m in "${models[@]}"; do
            step 120 -m "$m" -p 512 -n 64 -r 2 -t "$(IFS=,; echo "${threads[*]}")"
        done
    fi
    if has llama && [ -n "$llama" ]; then
        for m in "${models[@]}"; do
            run 120 "llama-bench -m $(basename "$m") -t ${threads[*]}" '^\|' \
                "$llama" -m "$m" -p 512 -n 64 -r 2 -t "$(IFS=,; echo "${threads[*]}")"
        done
    fi
    # Sandwich's configuration choice on this machine (SmolLM2), the GPU timed against it
    # (`--accel auto`), then the plan's prefill (where it placed the device) against the CPU alone.
    if has tune && [ "${#models[@]}" -gt 0 ]; then
        run 200 "corelm tune -m $(basename "${models[0]}")" '.' "$bin" tune -m "${models[0]}" -o "$out/plan.json"
        if [ -s "$out/plan.json" ]; then
            run 60 "corelm bench --plan (tuned)" 'pp|tg' "$bin" bench -m "${models[0]}" -p 512 -n 128 -r 2 --plan "$out/plan.json"
        fi
    fi
    echo "(done at $SECONDS s, $(left) s before the deadline)" >> "$log"
    cat "$log"
}

case "${1:-measure}" in
    pack) pack ;;
    measure) measure ;;
    *) echo "usage: $0 pack|measure" >&2; exit 2 ;;
esac
