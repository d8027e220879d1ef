#!/usr/bin/env bash
# The soak test (not in CI): `ringserve serve` under mixed valid and invalid requests, cancels and
# deadlines while workers are SIGKILLed and SIGSTOPped at random, for a bounded time; then every
# valid stream must be complete and token-exact against a reference run, the gateway's RSS and
# descriptors back near their starting values, and /dev/shm clean after SIGTERM
# (examples/soak.rs says exactly what is checked). Exits non-zero on any failure.
#
#   scripts/soak.sh                       # 10 minutes, 8 clients, 2 CPU workers, the demo model
#   SECONDS_TOTAL=60 CLIENTS=4 scripts/soak.sh
#   CHAOS=false scripts/soak.sh           # the load alone, no signals
set -euo pipefail
cd "$(dirname "$0")/.."

SECONDS_TOTAL=${SECONDS_TOTAL:-600}
CLIENTS=${CLIENTS:-8}
WORKERS=${WORKERS:-2}
DEVICE=${DEVICE:-cpu}
CHAOS=${CHAOS:-true}

cargo build --release --quiet --bin ringserve --example soak
RINGSERVE_BIN=target/release/ringserve target/release/examples/soak \
    --seconds "$SECONDS_TOTAL" --clients "$CLIENTS" --workers "$WORKERS" --device "$DEVICE" \
    --chaos "$CHAOS"
