#!/usr/bin/env python3
"""Embedding throughput of OpenAI-compatible servers, side by side, and how far their vectors agree.

Start the servers first, on the same model, threads and slots, e.g.

    target/release/corelm serve -m M.gguf --port 8080 --parallel 4 --batch-size 512 --threads 2
    llama-server -m M.gguf --port 8081 --embeddings --pooling mean -np 4 -c 8192 -b 512 -ub 512 -t 2

then

    scripts/bench_embed.py --server corelm=http://127.0.0.1:8080 --server llama-server=http://127.0.0.1:8081

Each round sends `--requests` requests of `--inputs` texts of about `--words` words each,
`--concurrency` at a time, to every server in turn (the order alternating between rounds), and
reports per server the median over rounds of inputs/s and prompt tokens/s (from `usage`). The
first server's vectors are compared with every other's on the same texts: cosine similarity
(min and mean over the texts). No dependency beyond the standard library.
"""
import argparse
import concurrent.futures
import json
import math
import random
import statistics
import time
import urllib.request

WORDS = ("the a of and to in is was for on that with as by at from it an be this which or are have "
         "river mountain city market engine model token memory cache thread core socket light "
         "quickly slowly bright dark ancient modern small large green red blue cold warm "
         "runs builds reads writes carries holds finds opens closes moves grows falls").split()


def texts(n, words, seed):
    rng = random.Random(seed)
    return [" ".join(rng.choice(WORDS) for _ in range(words)).capitalize() + "." for _ in range(n)]


def embed(url, inputs, timeout=600):
    body = json.dumps({"input": inputs, "encoding_format": "float"}).encode()
    req = urllib.request.Request(url + "/v1/embeddings", data=body, headers={"content-type": "application/json"})
    with urllib.request.urlopen(req, timeout=timeout) as r:
        out = json.load(r)
    data = sorted(out["data"], key=lambda d: d["index"])
    return [d["embedding"] for d in data], out.get("usage", {}).get("prompt_tokens", 0)


def round_trip(url, batches, concurrency):
    t0 = time.perf_counter()
    tokens = 0
    with concurrent.futures.ThreadPoolExecutor(concurrency) as ex:
        for _, n in ex.map(lambda b: embed(url, b), batches):
            tokens += n
    return time.perf_counter() - t0, tokens


def cosine(a, b):
    dot = sum(x * y for x, y in zip(a, b))
    na = math.sqrt(sum(x * x for x in a))
    nb = math.sqrt(sum(x * x for x in b))
    return dot / (na * nb) if na and nb else 0.0


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--server", action="append", required=True, help="NAME=BASE_URL (repeatable; the first is the reference)")
    ap.add_argument("--requests", type=int, default=8)
    ap.add_argument("--inputs", type=int, default=16, help="texts per request")
    ap.add_argument("--words", type=int, default=24, help="words per text")
    ap.add_argument("--concurrency", type=int, default=2)
    ap.add_argument("--rounds", type=int, default=3)
    a = ap.parse_args()
    servers = [s.split("=", 1) for s in a.server]
    batches = [texts(a.inputs, a.words, seed=i) for i in range(a.requests)]
    n_inputs = a.requests * a.inputs
    # Warm-up, and the vectors compared.
    vectors = {name: embed(url, batches[0])[0] for name, url in servers}
    results = {name: [] for name, _ in servers}
    for r in range(a.rounds):
        order = servers if r % 2 == 0 else servers[::-1]
        for name, url in order:
            secs, tokens = round_trip(url, batches, a.concurrency)
            results[name].append((n_inputs / secs, tokens / secs, tokens))
    print(f"{a.requests} requests x {a.inputs} inputs of {a.words} words, {a.concurrency} at a time, {a.rounds} rounds (medians)")
    print(f"{'server':<16}{'inputs/s':>10}{'tokens/s':>10}{'tokens':>8}")
    base = None
    for name, _ in servers:
        ips = statistics.median(x[0] for x in results[name])
        tps = statistics.median(x[1] for x in results[name])
        base = base or ips
        print(f"{name:<16}{ips:>10.1f}{tps:>10.1f}{results[name][0][2]:>8}   x{ips / base:.2f}")
    ref_name = servers[0][0]
    for name, _ in servers[1:]:
        cos = [cosine(x, y) for x, y in zip(vectors[ref_name], vectors[name])]
        print(f"cosine {ref_name} vs {name} over {len(cos)} texts: min {min(cos):.6f}, mean {statistics.mean(cos):.6f}")


if __name__ == "__main__":
    main()
