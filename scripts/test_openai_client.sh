#!/usr/bin/env bash
# Run tests/python/test_openai_client.py: the official `openai` client against `corelm serve`.
# Installs `openai` in a cached venv (CORELM_PY_VENV, default ~/.cache/corelm/openai-venv),
# starts the server on a free port with the default model, runs the test, stops the server.
set -euo pipefail
cd "$(dirname "$0")/.."
VENV=${CORELM_PY_VENV:-${XDG_CACHE_HOME:-$HOME/.cache}/corelm/openai-venv}
if [ ! -x "$VENV/bin/python" ]; then
    python3 -m venv "$VENV"
fi
"$VENV/bin/python" -c 'import openai' 2>/dev/null || "$VENV/bin/pip" install -q 'openai>=1.40,<3'
cargo build --release -q -p corelm-cli
PORT=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
LOG=$(mktemp)
# With prompt-lookup drafts on: they change no answer, so every check holds with them.
./target/release/corelm serve --port "$PORT" --ctx-size 1024 --parallel 2 --no-pin --lookup 4 >"$LOG" 2>&1 &
PID=$!
trap 'kill $PID 2>/dev/null || true; rm -f "$LOG"' EXIT
for _ in $(seq 1 100); do
    python3 -c "import urllib.request as u; u.urlopen('http://127.0.0.1:$PORT/health', timeout=1)" 2>/dev/null && break
    kill -0 $PID 2>/dev/null || { cat "$LOG"; exit 1; }
    sleep 0.1
done
CORELM_BASE_URL="http://127.0.0.1:$PORT/v1" CORELM_MODEL_ID="SmolLM2-135M-Instruct.Q4_1" \
    "$VENV/bin/python" tests/python/test_openai_client.py
