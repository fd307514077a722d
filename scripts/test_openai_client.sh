#!/usr/bin/env bash
# Run tests/python/test_openai_client.py and test_anthropic_client.py: the official `openai`
# and `anthropic` clients against `corelm serve`. Installs both in a cached venv
# (CORELM_PY_VENV, default ~/.cache/corelm/openai-venv), starts the server on a free port with
# the default model, runs the tests, stops the server.
set -euo pipefail
cd "$(dirname "$0")/.."
VENV=${CORELM_PY_VENV:-${XDG_CACHE_HOME:-$HOME/.cache}/corelm/openai-venv}
if [ ! -x "$VENV/bin/python" ]; then
    python3 -m venv "$VENV"
fi
"$VENV/bin/python" -c 'import openai' 2>/dev/null || "$VENV/bin/pip" install -q 'openai>=1.40,<3'
"$VENV/bin/python" -c 'import anthropic' 2>/dev/null || "$VENV/bin/pip" install -q 'anthropic>=0.40,<1'
cargo build --release -q -p corelm-cli
LOG=$(mktemp)
trap 'kill ${PID:-} 2>/dev/null || true; rm -f "$LOG"' EXIT
. scripts/serve_bg.sh
# With prompt-lookup drafts on: they change no answer, so every check holds with them. A
# second name for the model (`--alias`), the first the file's.
serve_bg "$LOG" --ctx-size 1024 --parallel 2 --no-pin --lookup 4 --alias SmolLM2-135M-Instruct.Q4_1,gpt-4o-mini
for t in test_openai_client test_anthropic_client; do
    CORELM_BASE_URL="http://127.0.0.1:$PORT/v1" CORELM_MODEL_ID="SmolLM2-135M-Instruct.Q4_1" \
        "$VENV/bin/python" "tests/python/$t.py"
done
