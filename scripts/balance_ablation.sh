#!/usr/bin/env bash
# Ablation of the accelerator's neuron balancing policies (KAIROX Fig. 10/15): for each
# --accel-policy, one `corelm bench` decode run at the same budget and sparsity, and the
# balance line it prints (group loads and bytes, the device's share of firing neurons, seconds
# issuing loads and waiting for the device), as a markdown table.
#
#   scripts/balance_ablation.sh MODEL [MEM=8M] [SPARSITY=0.25] [TOKENS=128] [THREADS=2]
#
# EXTRA="--accel-groups freq --accel-group 128" adds flags to every run.
# --sparsity needs the model's sidecar (`corelm sparsity collect`). On a software device
# (lavapipe) the tokens/s column measures the emulation, not an accelerator: the I/O and hit
# rate columns are the comparison there.
set -euo pipefail
model=${1:?usage: balance_ablation.sh MODEL [MEM] [SPARSITY] [TOKENS] [THREADS]}
mem=${2:-8M}
sparsity=${3:-0.25}
tokens=${4:-128}
threads=${5:-2}
bin=${CORELM:-target/release/corelm}
echo "model $(basename "$model"), --accel-mem $mem, --sparsity $sparsity, tg$tokens, $threads threads ${EXTRA:-}"
echo
echo "| policy | t/s | group loads | MB loaded | device hit rate | best fixed set in hindsight | load s | wait s | λ end |"
echo "|---|---|---|---|---|---|---|---|---|"
for p in static-groups topk lru tam tam-adaptive; do
    out=$("$bin" bench -m "$model" -p 0 -n "$tokens" -r 1 -t "$threads" --sparsity "$sparsity" --accel-mem "$mem" --accel-policy "$p" ${EXTRA:-} 2>&1)
    ts=$(grep -E "^\| .* \| tg$tokens \|" <<<"$out" | awk -F'|' '{print $5}' | awk '{print $1}')
    line=$(grep -o "balance $p: .*" <<<"$out" | head -1)
    [ -n "$line" ] || { echo "no balance line for $p:" >&2; echo "$out" >&2; exit 1; }
    loads=$(sed -E 's/.* ([0-9]+) group loads.*/\1/' <<<"$line")
    mb=$(sed -E 's/.*group loads \(([0-9.]+) MB.*/\1/' <<<"$line")
    hit=$(sed -E 's/.*hit rate ([0-9.]+ %).*/\1/' <<<"$line")
    best=$(sed -E 's/.*hindsight ([0-9.]+ %).*/\1/' <<<"$line")
    load_s=$(sed -E 's/.*MB, ([0-9.]+) s issuing.*/\1/' <<<"$line")
    wait_s=$(sed -E 's/.*, ([0-9.]+) s waiting for the device.*/\1/' <<<"$line")
    lambda=$(sed -E 's/.*λ ([0-9.]+).*/\1/' <<<"$line")
    echo "| $p | $ts | $loads | $mb | $hit | $best | $load_s | $wait_s | $lambda |"
done
