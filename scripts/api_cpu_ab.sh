#!/usr/bin/env bash
# Gateway CPU per streamed token of two builds side by side: one `serve --device null` of each
# (both pinned to CPU 0), the same `bench serve` load (CPU 1) through gRPC and through the OpenAI
# HTTP API of each in turn, ROUNDS times; prints the serve process's utime + stime (clock ticks)
# per run and the medians of the per-round ratios. The machine's state moves every run by 10-30 %,
# so compare within rounds and take many.
# Usage: scripts/api_cpu_ab.sh OLD_BIN NEW_BIN [ROUNDS] [CONCURRENCY]
set -euo pipefail
A=$1 B=$2 R=${3:-24} C=${4:-128}
DEMO=$(mktemp -d)
"$A" demo-model --out "$DEMO" >/dev/null 2>&1
start() { # bin log
    taskset -c 0 "$1" serve --model "$DEMO" --device null --addr 127.0.0.1:0 --http-addr 127.0.0.1:0 \
        --metrics-addr 127.0.0.1:0 >"$2" 2>/dev/null &
    echo $!
}
LA=$(mktemp) LB=$(mktemp)
SA=$(start "$A" "$LA") SB=$(start "$B" "$LB")
trap 'kill $SA $SB 2>/dev/null; rm -rf "$DEMO" "$LA" "$LB"' EXIT
until grep -q ready "$LA" && grep -q ready "$LB"; do sleep 0.2; done
addr() { grep -o "$2=[^ ]*" "$1" | cut -d= -f2; }
run() { # pid log door
    local extra=() before after
    [ "$3" = http ] && extra=(--openai-addr "$(addr "$2" http)")
    before=$(awk '{print $14 + $15}' /proc/"$1"/stat)
    taskset -c 1 "$A" bench serve --addr "http://$(addr "$2" grpc)" --concurrency "$C" --num-requests $((8 * C)) \
        --input-len 32 --output-len 2000 --quiet "${extra[@]}" >/dev/null
    after=$(awk '{print $14 + $15}' /proc/"$1"/stat)
    echo $((after - before))
}
OUT=$(mktemp)
for _ in $(seq "$R"); do
    echo "$(run "$SA" "$LA" grpc) $(run "$SA" "$LA" http) $(run "$SB" "$LB" grpc) $(run "$SB" "$LB" http)" | tee -a "$OUT"
done
python3 - "$OUT" <<'PY'
import statistics as st, sys
rows = [list(map(int, l.split())) for l in open(sys.argv[1]) if l.strip()]
med = lambda f: st.median(f(r) for r in rows)
print(f"ticks, medians: old gRPC {med(lambda r: r[0])}, HTTP {med(lambda r: r[1])}; new gRPC {med(lambda r: r[2])}, HTTP {med(lambda r: r[3])}")
print(f"per round, medians: HTTP / gRPC old {med(lambda r: r[1] / r[0]):.3f}, new {med(lambda r: r[3] / r[2]):.3f}; "
      f"new / old gRPC {med(lambda r: r[2] / r[0]):.3f}, HTTP {med(lambda r: r[3] / r[1]):.3f}")
PY
