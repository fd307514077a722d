#!/usr/bin/env python3
"""A model on paper (not a measurement) of decode speed with and without tensor parallelism on
a multi-node machine, for ArcLight's 4-socket Kunpeng 920 (8 NUMA nodes of 24 cores).

Decode is memory-bound: a token's time is the time to stream every weight byte once, plus the
barriers between graph nodes. What changes with the plan is where the bytes live and how many
workers each barrier waits for:

* one node (llama.cpp's advice: one instance per node): W bytes at one node's local bandwidth;
  barriers of one node's workers;
* all nodes, weights interleaved (`--numa distribute`, what llama.cpp does): each node reads
  1/N of W, but 1/N of its pages are local and the rest remote, at the remote bandwidth of
  each pair, and all remote traffic crosses the inter-socket links (capped); every barrier
  waits for all N·C workers;
* all nodes, tensor parallel (`--numa tp`): each node reads its own W/N locally; between
  parallel nodes only its group's barrier; per layer two gathers with a global barrier each
  and the reads of N partial vectors of n_embd floats.

Inputs are stated below with their sources; the ones marked "assumed" are not measured on the
machine. The barrier costs are scaled from the one measured here (2 threads, one node). The
result is set beside ArcLight's reported +46 % over llama.cpp; it is a model, and the docs say
so.
"""

import argparse

# Kunpeng 920-4826, 4 sockets: 8 nodes (dies) of 24 cores; per die 4 DDR4-2933 channels.
NODES = 8
CORES = 24
PEAK_NODE_GBS = 4 * 2933e6 * 8 / 1e9  # 93.9 GB/s per node (channels x MT/s x 8 bytes)
STREAM_EFF = 0.75  # assumed: sustained read / peak (STREAM-like)
# Assumed remote/local bandwidth ratios: the other die of the same socket, and another socket.
R_SAME_SOCKET = 0.6
R_OTHER_SOCKET = 0.3
# Assumed total inter-socket bandwidth (all Hydra links together), GB/s.
LINKS_GBS = 120.0
# Barrier cost: measured 287 ns at 2 threads on this VM (`corelm bench --profile`); assumed to
# grow with log2(workers) and to cost 3x more once it spans sockets.
BARRIER_2T_NS = 287.0


def barrier_ns(workers, sockets):
    import math

    return BARRIER_2T_NS * max(1.0, math.log2(workers)) * (3.0 if sockets > 1 else 1.0)


def model(w_bytes, n_layer, n_embd, nodes_per_graph_nodes, NODES=NODES):
    """Tokens/s for the plans (one node; all nodes with pages interleaved; all nodes with the
    weights on one node, where a loader thread first touched them; tensor parallel).
    `nodes_per_graph_nodes`: (graph nodes per token without TP, parallel nodes per layer with
    TP)."""
    local = PEAK_NODE_GBS * STREAM_EFF * 1e9
    serial_nodes, par_per_layer = nodes_per_graph_nodes
    # One node.
    t1 = w_bytes / local + serial_nodes * barrier_ns(CORES, 1) * 1e-9
    # All nodes, interleaved pages: node i reads W/N, a 1/N share of it from each node j.
    share = w_bytes / NODES
    per_node = 0.0
    remote_cross = 0.0
    for j in range(NODES):
        same_socket = j // 2 == 0  # nodes 0 and 1 are one socket's two dies
        if j == 0:
            per_node += share / NODES / local
        else:
            r = R_SAME_SOCKET if same_socket else R_OTHER_SOCKET
            per_node += share / NODES / (local * r)
            if not same_socket:
                remote_cross += share / NODES
    links = remote_cross * NODES / (LINKS_GBS * 1e9)
    sockets = (NODES + 1) // 2
    t_dist = max(per_node, links) + serial_nodes * barrier_ns(NODES * CORES, sockets) * 1e-9
    # All nodes, every page on node 0: its bandwidth is shared by everyone, and the other
    # nodes read remotely.
    t_one_node_pages = max(w_bytes / local, w_bytes * (NODES - 2) / NODES / (LINKS_GBS * 1e9)) + serial_nodes * barrier_ns(NODES * CORES, sockets) * 1e-9
    # Tensor parallel: local shards, group barriers inside, 2 gathers per layer.
    gathers = 2 * n_layer
    serial_tp = serial_nodes - par_per_layer * n_layer  # nodes left serial
    gather_read = gathers * NODES * n_embd * 4 / (local * R_OTHER_SOCKET)
    t_tp = (
        w_bytes / NODES / local
        + par_per_layer * n_layer * barrier_ns(CORES, 1) * 1e-9
        + (serial_tp + gathers) * barrier_ns(NODES * CORES, sockets) * 1e-9
        + gather_read
    )
    return 1 / t1, 1 / t_dist, 1 / t_one_node_pages, 1 / t_tp


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.parse_args()
    print("Kunpeng 920 4P model: %d nodes x %d cores, %.1f GB/s local per node (peak %.1f x %.2f)"
          % (NODES, CORES, PEAK_NODE_GBS * STREAM_EFF, PEAK_NODE_GBS, STREAM_EFF))
    print("assumed remote/local %.1f (same socket), %.1f (other socket); links %.0f GB/s; "
          "barrier %.0f ns at 2 threads (measured here)" % (R_SAME_SOCKET, R_OTHER_SOCKET, LINKS_GBS, BARRIER_2T_NS))
    print()
    print("| nodes used | model | GB/token | one node | all, interleaved | all, pages on node 0 | all, TP | TP / interleaved | TP / pages on node 0 | TP / one node |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    # (name, weight bytes per token, layers, n_embd, graph nodes per token at --tp 1, parallel
    # nodes per layer at --tp N): the 0.5B is corelm's measured graph (605 nodes per token for
    # SmolLM2's 30 layers, ~20 per layer, 9 of them per shard; Qwen2.5 similar at 24 layers);
    # the 7B is Llama-2-7B Q4_0 (32 layers, 4096 wide), ArcLight's class of model.
    for n_nodes in (4, 8):
        for name, w, n_layer, n_embd, nodes in [
            ("Qwen2.5-0.5B Q4_K_M", 0.40e9, 24, 896, (24 * 20 + 5, 14)),
            ("Llama-2-7B Q4_0", 3.83e9, 32, 4096, (32 * 20 + 5, 14)),
        ]:
            one, dist, node0, tp = model(w, n_layer, n_embd, nodes, n_nodes)
            print("| %d | %s | %.2f | %.1f | %.1f | %.1f | %.1f | %.2fx | %.2fx | %.2fx |"
                  % (n_nodes, name, w / 1e9, one, dist, node0, tp, tp / dist, tp / node0, tp / one))
    print()
    print("t/s. ArcLight reports up to +46 % decode over llama.cpp on this machine.")
    print("An upper bound: no compute ceiling, no link contention beyond one cap, no imbalance.")


if __name__ == "__main__":
    main()
