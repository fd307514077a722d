#!/usr/bin/env bash
# lm-evaluation-harness against `corelm serve`, offline: a generated multiple-choice task (100
# two-number sums and differences, four choices) scored through `/v1/completions` with
# `echo` and `logprobs` (the `local-completions` model, token lists, the server's own tokenizer
# through `/tokenizer_info` and `/tokenize`), then — where llama-cpp-python is installed —
# every request's log-likelihood checked against llama.cpp's logits (scripts/check_scores.py).
#
#   scripts/lm_eval_local.sh [MODEL_FILE_STEM]     (default SmolLM2-135M-Instruct.Q4_1)
#
# LMEVAL_VENV (default /work/cache/lmeval-venv) gets `lm_eval[api]`; LLAMA_VENV (default
# /work/cache/llama-venv) is used if it has llama_cpp. Not part of the tests: it measures.
set -euo pipefail
cd "$(dirname "$0")/.."
MODEL=${1:-SmolLM2-135M-Instruct.Q4_1}
GGUF=${CORELM_MODELS:-$HOME/.cache/corelm/models}/$MODEL.gguf
LMEVAL_VENV=${LMEVAL_VENV:-/work/cache/lmeval-venv}
LLAMA_VENV=${LLAMA_VENV:-/work/cache/llama-venv}
[ -x "$LMEVAL_VENV/bin/lm_eval" ] || { python3 -m venv "$LMEVAL_VENV"; "$LMEVAL_VENV/bin/pip" install -q 'lm_eval[api]==0.4.13'; }
cargo build --release -q -p corelm-cli
WORK=$(mktemp -d)
python3 - "$WORK" <<'PY'
import json, random, sys
work = sys.argv[1]
rng = random.Random(7)
with open(f"{work}/arith.jsonl", "w") as f:
    for _ in range(100):
        a, b, op = rng.randint(2, 49), rng.randint(2, 49), rng.choice("+-")
        ans = a + b if op == "+" else a - b
        wrong = set()
        while len(wrong) < 3:
            w = ans + rng.choice([-10, -3, -2, -1, 1, 2, 3, 10])
            if w != ans:
                wrong.add(w)
        choices = [str(x) for x in [ans, *wrong]]
        rng.shuffle(choices)
        f.write(json.dumps({"question": f"{a} {op} {b} =", "choices": choices, "answer": choices.index(str(ans))}) + "\n")
with open(f"{work}/arith.yaml", "w") as f:
    f.write(f"""task: corelm_arith
dataset_path: json
dataset_kwargs:
  data_files:
    test: {work}/arith.jsonl
test_split: test
output_type: multiple_choice
doc_to_text: "{{{{question}}}}"
doc_to_choice: "{{{{choices}}}}"
doc_to_target: "{{{{answer}}}}"
metric_list:
  - metric: acc
  - metric: acc_norm
""")
PY
trap 'kill ${PID:-} 2>/dev/null || true; rm -rf "$WORK"' EXIT
. scripts/serve_bg.sh
serve_bg "$WORK/serve.log" --model "$GGUF" --ctx-size 1024 --parallel 2 --no-pin
START=$(date +%s.%N)
HF_DATASETS_OFFLINE=1 HF_HUB_OFFLINE=1 "$LMEVAL_VENV/bin/lm_eval" --model local-completions \
    --model_args "model=$MODEL,base_url=http://127.0.0.1:$PORT/v1/completions,num_concurrent=2,max_length=1024,tokenizer_backend=remote" \
    --include_path "$WORK" --tasks corelm_arith --output_path "$WORK/out" --log_samples 2>&1 | grep -E '^\|'
echo "lm_eval wall time: $(python3 -c "import time; print(round(time.time() - $START, 1))") s"
if "$LLAMA_VENV/bin/python" -c 'import llama_cpp' 2>/dev/null; then
    "$LLAMA_VENV/bin/python" scripts/check_scores.py --model "$GGUF" --samples "$(ls "$WORK"/out/*/samples_*.jsonl)"
fi
