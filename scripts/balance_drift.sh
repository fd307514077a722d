#!/usr/bin/env bash
# Online neuron balancing under drift (KAIROX §5.3: why balance online at all): a text whose
# domain changes — prose, then source code, then prose again — is fed token by token
# (`corelm perplexity -b 1`, one pass per token as in decode), with the accelerator's neurons
# chosen from a calibration on other prose. Each policy's device hit rate and group loads are
# printed chunk by chunk, so the table shows whether a policy follows the switch to code and
# back (the static set cannot), and what it pays in loads, beside the hit rate of the best
# fixed set of groups for that chunk in hindsight (the first policy's run): what a static
# choice knowing the chunk would reach; a policy beats it only by following changes within it.
#
#   scripts/balance_drift.sh MODEL SIDECAR [MEM=8M] [SPARSITY=0.5] [CHUNK=128] [THREADS=2]
#
# SIDECAR: `corelm sparsity collect -m MODEL --file PROSE -o SIDECAR` on a calibration text
# (docs/sparsity.md uses Debian's license texts). SECTIONS="3 3 3" sets the chunks of prose,
# code and prose; CODE=FILE the code (default: Python's json package, else this repository's
# Rust). POLICIES overrides the policies compared. On a software device (lavapipe) only the hit
# rate and load columns mean anything; time is the emulation's.
set -euo pipefail
model=${1:?usage: balance_drift.sh MODEL SIDECAR [MEM] [SPARSITY] [CHUNK] [THREADS]}
sidecar=${2:?usage: balance_drift.sh MODEL SIDECAR [MEM] [SPARSITY] [CHUNK] [THREADS]}
mem=${3:-8M}
sparsity=${4:-0.5}
chunk=${5:-128}
threads=${6:-2}
policies=${POLICIES:-static-groups lru tam tam-adaptive}
read -r n_prose1 n_code n_prose2 <<<"${SECTIONS:-3 3 3}"
bin=${CORELM:-target/release/corelm}
cd "$(dirname "$0")/.."
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

code=${CODE:-}
if [ -z "$code" ]; then
    code="$work/code.txt"
    if ls /usr/lib/python3*/json/decoder.py >/dev/null 2>&1; then
        cat /usr/lib/python3*/json/{decoder,encoder,scanner}.py >"$code"
    else
        cat crates/kernels/src/matmul/portable.rs crates/kernels/src/matmul/lanes.rs >"$code"
    fi
fi

# The text: each section cut at a line so that it holds about its chunks' tokens; the chunks'
# domains follow from the sections' token counts.
python3 - "$bin" "$model" "$chunk" fixtures/ppl-gpl3.txt "$code" "$n_prose1" "$n_code" "$n_prose2" "$work" <<'PY'
import json, subprocess, sys
bin_, model, chunk, prose_f, code_f, n1, nc, n2, work = sys.argv[1:]
chunk, n1, nc, n2 = int(chunk), int(n1), int(nc), int(n2)
def count(text):
    out = subprocess.run([bin_, "tokenize", "-m", model, "--no-special", text], capture_output=True, text=True, check=True).stdout
    return len(json.loads(out))
def take(lines, start, tokens):
    """Lines from `start` while the section stays within `tokens` (bisection on the line count)."""
    lo, hi = start, len(lines)
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if count("".join(lines[start:mid])) <= tokens:
            lo = mid
        else:
            hi = mid - 1
    return lo
prose = open(prose_f).read().splitlines(keepends=True)
code = open(code_f).read().splitlines(keepends=True)
sections, at = [], 0
end = take(prose, 0, n1 * chunk); sections.append(("prose", "".join(prose[:end]))); at = end
end2 = take(code, 0, nc * chunk); sections.append(("code", "".join(code[:end2])))
end3 = take(prose, at, n2 * chunk); sections.append(("prose", "".join(prose[at:end3])))
# Pad the last section so the text covers every chunk (perplexity drops a partial one).
text = "".join(s for _, s in sections)
open(f"{work}/drift.txt", "w").write(text + "".join(prose[end3:end3 + 200]))
# Domain of each chunk: the section holding most of its tokens (BOS first).
bounds, total = [], 1
for name, s in sections:
    n = count(s); bounds.append((name, total, total + n)); total += n
labels = []
for c in range(n1 + nc + n2):
    lo, hi = c * chunk, (c + 1) * chunk
    share = {}
    for name, a, b in bounds:
        share[name] = share.get(name, 0) + max(0, min(hi, b) - max(lo, a))
    labels.append(max(share, key=share.get) if any(share.values()) else "prose")
open(f"{work}/labels", "w").write(" ".join(labels))
PY
read -r -a labels <"$work/labels" || true
n_chunks=${#labels[@]}
echo "model $(basename "$model"), --accel-mem $mem, --sparsity $sparsity, chunks of $chunk tokens fed one token per pass, $threads threads"
echo "calibration: $(basename "$sidecar"); sections: prose $n_prose1, code $n_code, prose $n_prose2 chunks"
echo

declare -A hit best loads
for p in $policies; do
    out=$("$bin" perplexity -m "$model" -f "$work/drift.txt" -c "$chunk" -b 1 --chunks "$n_chunks" -t "$threads" \
        --sparsity "$sparsity" --sparsity-file "$sidecar" --accel-mem "$mem" --accel-policy "$p" ${EXTRA:-} 2>&1) || {
        echo "$p failed:" >&2
        echo "$out" >&2
        exit 1
    }
    while read -r c h b l; do
        hit[$p,$c]=$h
        best[$p,$c]=$b
        loads[$p,$c]=$l
    done < <(sed -nE 's/^\[chunk ([0-9]+): balance [a-z-]+: .* hit rate ([0-9.]+) % .*hindsight ([0-9.]+) %.*, ([0-9]+) group loads.*/\1 \2 \3 \4/p' <<<"$out")
done

first=${policies%% *}
header="| chunk | text | best fixed set in hindsight % |"
rule="|---|---|---|"
for p in $policies; do
    header+=" $p hit % (loads) |"
    rule+="---|"
done
echo "$header"
echo "$rule"
for ((c = 1; c <= n_chunks; c++)); do
    row="| $c | ${labels[$((c - 1))]} | ${best[$first,$c]:-?} |"
    for p in $policies; do
        row+=" ${hit[$p,$c]:-?} (${loads[$p,$c]:-?}) |"
    done
    echo "$row"
done
