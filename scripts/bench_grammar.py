#!/usr/bin/env python3
"""What a GBNF grammar costs a decode step: `corelm serve` and llama.cpp's `llama-server`, each
with and without the grammar, on the same model, threads and prompts.

Start the servers first (one slot each, same threads), e.g.

    target/release/corelm serve -m M.gguf --port 8080 --parallel 1 --threads 2
    llama-server -m M.gguf --port 8081 -np 1 -c 4096 -t 2

then

    scripts/bench_grammar.py --server corelm=http://127.0.0.1:8080 --server llama-server=http://127.0.0.1:8081

Every case is sent to llama.cpp's `POST /completion` (both servers answer it) with
`n_predict` tokens, the case's temperature and seed, `cache_prompt` off, once without and once
with its grammar, in alternating order over `--rounds` rounds, each server in turn. Reported per
server and case: the median decode time per token (`timings.predicted_ms / predicted_n`) without
and with the grammar, and their difference, the grammar's cost per token. The grammars keep
going past `n_predict` (none completes early), so both runs decode the same number of tokens.
No dependency beyond the standard library.
"""
import argparse
import json
import statistics
import urllib.request

# (name, prompt, grammar, temperature): the model follows the first two, mostly not the last.
CASES = [
    ("lines of text", "Write a story about the sea:\n", r'root ::= ([^\n]+ "\n")+', 0.0),
    ("lines of text, sampled", "Write a story about the sea:\n", r'root ::= ([^\n]+ "\n")+', 0.8),
    ("JSON list of objects", "A JSON list of ten people with their names, ages and cities:\n",
     r'''root ::= "[" ws item ("," ws item)*
item ::= "{" ws "\"name\":" ws str "," ws "\"age\":" ws [0-9]{1,3} "," ws "\"city\":" ws str ws "}"
str ::= "\"" [^"\\\n]{1,40} "\""
ws ::= [ \n]{0,4}''', 0.0),
    ("digits and commas (against the model)", "Write a story about the sea:\n", r'root ::= [0-9]{1,4} ("," [0-9]{1,4})*', 0.0),
]


def post(url, body, timeout=600):
    req = urllib.request.Request(url + "/completion", data=json.dumps(body).encode(), headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=timeout) as r:
        return json.loads(r.read())


def ms_per_token(url, prompt, grammar, temp, seed, n):
    body = {"prompt": prompt, "n_predict": n, "temperature": temp, "seed": seed, "cache_prompt": False, "ignore_eos": True}
    if grammar:
        body["grammar"] = grammar
    t = post(url, body)["timings"]
    return t["predicted_ms"] / max(t["predicted_n"], 1)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--server", action="append", required=True, help="name=URL")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--n-predict", type=int, default=128)
    a = ap.parse_args()
    servers = [s.split("=", 1) for s in a.server]
    times = {(s, c[0], g): [] for s, _ in servers for c in CASES for g in (False, True)}
    for r in range(a.rounds):
        for name, url in servers:
            for case, prompt, grammar, temp in CASES:
                order = (False, True) if r % 2 == 0 else (True, False)
                for g in order:
                    times[(name, case, g)].append(ms_per_token(url, prompt, grammar if g else None, temp, 42 + r, a.n_predict))
    print(f"| server | case | ms/token without | with grammar | grammar's cost (ms/token) |")
    print("|---|---|---|---|---|")
    for name, _ in servers:
        for case, *_ in CASES:
            off, on = statistics.median(times[(name, case, False)]), statistics.median(times[(name, case, True)])
            print(f"| {name} | {case} | {off:.2f} | {on:.2f} | {on - off:+.2f} |")


if __name__ == "__main__":
    main()
