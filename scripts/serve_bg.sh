# Sourced by the scripts that run a client against `corelm serve`: `serve_bg LOG ARGS...`
# starts target/release/corelm serve ARGS on a free local port, waits until /health answers
# (or prints LOG and exits if the server dies first), and leaves PORT and PID set.
serve_bg() {
    local log=$1
    shift
    PORT=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
    ./target/release/corelm serve --port "$PORT" "$@" >"$log" 2>&1 &
    PID=$!
    for _ in $(seq 1 300); do
        python3 -c "import urllib.request as u; u.urlopen('http://127.0.0.1:$PORT/health', timeout=1)" 2>/dev/null && return 0
        kill -0 "$PID" 2>/dev/null || { cat "$log"; exit 1; }
        sleep 0.1
    done
    echo "corelm serve did not answer /health" >&2
    exit 1
}
