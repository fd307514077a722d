#!/usr/bin/env bash
# Writes the hwloc XML topology snapshots in fixtures/topo/ (run by hand; the files are committed).
#
# The three seed machines are *modelled* from their public specifications, not dumped from the
# machines: hwloc builds each from a synthetic description (packages, NUMA nodes with memory,
# L3 and L2 sizes, cores, PUs numbered as Linux numbers them: SMT siblings N apart), then
# hwloc-annotate adds the NUMA latency matrix (ACPI SLIT values as `numactl -H` prints them).
# Kunpeng's 4-core clusters sharing an L3 tag are deliberately absent: hwloc does not show them,
# which is why Sandwich's `group` transform exists. `this-machine.xml` is a real dump.
#
# Needs apt `hwloc-nox` (lstopo-no-graphics, hwloc-annotate).
set -euo pipefail
cd "$(dirname "$0")/../fixtures/topo"

GiB=1073741824
KiB=1024
MiB=1048576

# name, synthetic description, node count, distance function (awk expression of i, j)
make() {
    local name=$1 synth=$2 nodes=$3 dist=$4
    lstopo-no-graphics -i "$synth" --of xml "$name.xml.tmp"
    {
        echo 5 # HWLOC_DISTANCES_KIND_FROM_OS | HWLOC_DISTANCES_KIND_MEANS_LATENCY
        echo "$nodes"
        for ((i = 0; i < nodes; i++)); do echo "NUMANode:$i"; done
        awk -v n="$nodes" "BEGIN { for (i = 0; i < n; i++) for (j = 0; j < n; j++) print ($dist) }"
    } > dist.tmp
    # hwloc-annotate names the matrix after its kind; rename it as Linux does.
    sed -i '1i name=NUMALatency' dist.tmp
    hwloc-annotate "$name.xml.tmp" "$name.xml" -- none -- distances dist.tmp
    rm -f "$name.xml.tmp" dist.tmp
    echo "$name.xml: $(lstopo-no-graphics -i "$name.xml" --of console | head -1)"
}

# 4x Kunpeng 920-4826 (ArcLight's machine): 48 cores per socket in two dies (SCCLs), each die a
# NUMA node with 24 cores, a 24 MiB L3 and 512 KiB L2 per core, no SMT; 64 GiB per node.
# Distances: 10 local, 12 the other die of the socket, 20 + 2*(die_i + die_j) to a neighbouring
# socket and 4 more to the opposite one (socket s and s^2): modelled on the 2-socket SLIT.
make kunpeng920-4p \
    "pack:4 numa:2(memory=$((64 * GiB))) l3:1(size=$((24 * MiB))) l2:24(size=$((512 * KiB))) core:1 pu:1" \
    8 'i == j ? 10 : (int(i / 2) == int(j / 2) ? 12 : 20 + 2 * (i % 2 + j % 2) + ((int(i / 2) + 2) % 4 == int(j / 2) ? 4 : 0))'

# 2x AMD EPYC 7H12 (NPS1): 64 cores per socket, one NUMA node per socket, a 16 MiB L3 per
# 4-core CCX, 512 KiB L2 per core, SMT2 (PU n and n+128 are siblings); 256 GiB per node.
# Distances 10/32 as Rome's SLIT reports them.
make epyc7h12-2p \
    "pack:2 numa:1(memory=$((256 * GiB))) l3:16(size=$((16 * MiB))) l2:4(size=$((512 * KiB))) core:1 pu:2(indexes=2*128:1*2)" \
    2 'i == j ? 10 : 32'

# 2x Intel Xeon Gold 6230: 20 cores per socket, one NUMA node per socket, 27.5 MiB L3 per
# socket, 1 MiB L2 per core, SMT2 (PU n and n+40 are siblings); 96 GiB per node. Distances 10/21.
make xeon6230-2p \
    "pack:2 numa:1(memory=$((96 * GiB))) l3:1(size=$((55 * MiB / 2))) l2:20(size=$MiB) core:1 pu:2(indexes=2*40:1*2)" \
    2 'i == j ? 10 : 21'

# 2x Intel Xeon Gold 6151 (AWS c5.18xlarge-class): 18 cores per socket, one NUMA node per
# socket, 24.75 MiB L3 per socket, 1 MiB L2 per core, SMT2 (siblings 36 apart); 72 GiB per node.
make xeon6151-2p \
    "pack:2 numa:1(memory=$((72 * GiB))) l3:1(size=$((99 * MiB / 4))) l2:18(size=$MiB) core:1 pu:2(indexes=2*36:1*2)" \
    2 'i == j ? 10 : 21'

# 2x Intel Xeon Platinum 8272CL (Azure Fsv2/Dv4-class): 26 cores per socket, one NUMA node per
# socket, 35.75 MiB L3 per socket, 1 MiB L2 per core, SMT2 (siblings 52 apart); 96 GiB per node.
make xeon8272cl-2p \
    "pack:2 numa:1(memory=$((96 * GiB))) l3:1(size=$((143 * MiB / 4))) l2:26(size=$MiB) core:1 pu:2(indexes=2*52:1*2)" \
    2 'i == j ? 10 : 21'

# The development machine this was written on (2 vCPUs of an AMD EPYC Zen 4, one node).
if [[ ${1:-} == --this-machine ]]; then
    lstopo-no-graphics --no-io --of xml this-machine.xml
    echo "this-machine.xml: $(lstopo-no-graphics -i this-machine.xml --of console | head -1)"
fi
