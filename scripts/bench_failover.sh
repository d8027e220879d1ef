#!/usr/bin/env bash
# Failover time on the CPU: `serve --workers 2` on the tiny-llama fixture, 32 greedy streams of 400
# tokens, SIGKILL of worker 0 once a quarter of the tokens arrived; prints SIGKILL -> next token on the interrupted streams.
#   usage: scripts/bench_failover.sh [ROUNDS]     (from the repository root)
set -euo pipefail
ROUNDS=${1:-3}
cargo build --release --quiet --bin ringserve --example failover_time
BIN=${CARGO_TARGET_DIR:-target}/release
LOG=$(mktemp)
"$BIN/ringserve" serve --model tests/fixtures/tiny-llama --workers 2 --addr 127.0.0.1:50071 \
  --metrics-addr 127.0.0.1:9171 > "$LOG" 2>&1 &
SERVER=$!
trap 'kill $SERVER 2>/dev/null; wait $SERVER 2>/dev/null; rm -f "$LOG"' EXIT
READY=0
for round in $(seq 1 "$ROUNDS"); do
  # Wait for a new "worker 0 ready" line: the first start, then the restart after each kill.
  for _ in $(seq 1 1200); do
    [ "$(grep -c 'worker 0 ready pid=' "$LOG" || true)" -gt "$READY" ] && break
    sleep 0.1
  done
  READY=$((READY + 1))
  PID=$(grep -o 'worker 0 ready pid=[0-9]*' "$LOG" | tail -1 | cut -d= -f2)
  sleep 1  # let the restarted worker settle
  echo "round $round: worker 0 pid $PID"
  "$BIN/examples/failover_time" --addr http://127.0.0.1:50071 --pid "$PID" --streams 32 \
    --max-tokens 400 --kill-at 0.25
done
