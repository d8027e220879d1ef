#!/usr/bin/env bash
# Output throughput against the number of CPU workers: `serve --workers N` on the built-in demo
# model, then `ringserve bench serve` (closed loop) against it, for each N.
#   usage: scripts/bench_workers.sh [N...]     (default: 1 2; from the repository root)
set -euo pipefail
COUNTS=${*:-1 2}
cargo build --release --quiet --bin ringserve
BIN=${CARGO_TARGET_DIR:-target}/release/ringserve
for n in $COUNTS; do
  LOG=$(mktemp)
  "$BIN" serve --workers "$n" --addr 127.0.0.1:50072 --metrics-addr 127.0.0.1:9172 > "$LOG" 2>&1 &
  SERVER=$!
  for _ in $(seq 1 1200); do
    [ "$(grep -c 'ready pid=' "$LOG" || true)" -ge "$n" ] && break
    sleep 0.1
  done
  echo "== $n worker(s), $(nproc) cores, load average $(cut -d' ' -f1 /proc/loadavg)"
  "$BIN" bench serve --addr http://127.0.0.1:50072 --num-requests 96 --concurrency 32 \
    --input-len 128 --output-len 64 --quiet
  kill "$SERVER"; wait "$SERVER" 2>/dev/null || true
  rm -f "$LOG"
done
