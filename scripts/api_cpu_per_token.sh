#!/usr/bin/env bash
# Gateway CPU per streamed token through gRPC and through the OpenAI HTTP API, in one run: one
# `serve --device null` on the demo model, the same `bench serve` load through each door in turn
# (alternating, ROUNDS times), the gateway's utime+stime from /proc/PID/stat around each run.
# Usage: scripts/api_cpu_per_token.sh [CONCURRENCY] [ROUNDS]   (after cargo build --release)
# PIN=1: the server (gateway and worker) on CPU 0, the load generator on CPU 1, so the client's own
# cost (the HTTP client parses JSON, the gRPC one protobuf) does not preempt the gateway it measures.
# H2=1: a third door each round, the HTTP API over HTTP/2 (`--openai-http2`: the clients share
# `--connections` connections, as the gRPC clients do).
set -euo pipefail
C=${1:-16}
ROUNDS=${2:-2}
BIN=${BIN:-target/release/ringserve}
SERVER_CPU=(); CLIENT_CPU=()
if [ "${PIN:-0}" = 1 ]; then SERVER_CPU=(taskset -c 0); CLIENT_CPU=(taskset -c 1); fi
DEMO=$(mktemp -d)
$BIN demo-model --out "$DEMO" >/dev/null 2>&1
LOG=$(mktemp)
${SERVER_CPU[@]+"${SERVER_CPU[@]}"} $BIN serve --model "$DEMO" --device null --addr 127.0.0.1:0 --http-addr 127.0.0.1:0 \
    --metrics-addr 127.0.0.1:0 >"$LOG" 2>/dev/null &
SERVE=$!
trap 'kill $SERVE 2>/dev/null; rm -rf "$DEMO" "$LOG"' EXIT
until grep -q "ready" "$LOG"; do sleep 0.2; done
GRPC=$(grep -o 'grpc=[^ ]*' "$LOG" | cut -d= -f2)
HTTP=$(grep -o 'http=[^ ]*' "$LOG" | cut -d= -f2)
ticks() { awk '{print $14 + $15}' /proc/$SERVE/stat; }
HZ=$(getconf CLK_TCK)
run() { # $1: label, rest: extra bench flags
    local label=$1; shift
    local before after out tokens
    before=$(ticks)
    out=$(${CLIENT_CPU[@]+"${CLIENT_CPU[@]}"} $BIN bench serve --addr "http://$GRPC" --concurrency "$C" --num-requests $((4 * C)) \
        --input-len 32 --output-len 2000 --quiet "$@")
    after=$(ticks)
    tokens=$(echo "$out" | grep -o '[0-9]* out)' | cut -d' ' -f1)
    tps=$(echo "$out" | grep -o '[0-9.]* output tok/s' | cut -d' ' -f1)
    echo "$out" | grep -q "errors 0" || { echo "$label: errors: $out" >&2; exit 1; }
    awk -v l="$label" -v t="$tokens" -v d=$((after - before)) -v hz="$HZ" -v tps="$tps" 'BEGIN {
        printf "%-6s %10s tok/s  %8d tokens  %6.0f ms CPU  %.2f us/token\n", l, tps, t, d * 1000 / hz, d * 1e6 / hz / t }'
}
for _ in $(seq "$ROUNDS"); do
    run grpc
    run http --openai-addr "$HTTP"
    if [ "${H2:-0}" = 1 ]; then run http2 --openai-addr "$HTTP" --openai-http2; fi
done
