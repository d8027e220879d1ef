#!/usr/bin/env bash
# Runs the README's SmolLM2 block as written: its first line (fetch), its second in the background
# (serve) until the server is healthy, its third (client), and checks the answer names Paris.
set -euo pipefail
cd "$(dirname "$0")/.."
mapfile -t lines < <(awk '/^<!-- smollm2 -->$/ {on=1; next} on && /^```sh$/ {inside=1; next}
    inside && /^```$/ {exit} inside {sub(/[[:space:]]+#.*$/, ""); print}' README.md)
[ "${#lines[@]}" -eq 3 ] || { echo "README: expected 3 lines in the smollm2 block, found ${#lines[@]}" >&2; exit 1; }
# Built first, so that the wait below is for serve, not for `cargo run`'s build.
cargo build --release --quiet
echo "+ ${lines[0]}"; bash -c "${lines[0]}"
echo "+ ${lines[1]} &"
log=$(mktemp)
bash -c "exec ${lines[1]}" 2>"$log" &
serve=$!
trap 'kill -TERM $serve 2>/dev/null || true; wait $serve 2>/dev/null || true' EXIT
for _ in $(seq 1 600); do
    if grep -q "worker ready" "$log"; then break; fi
    if ! kill -0 $serve 2>/dev/null; then cat "$log" >&2; echo "serve exited" >&2; exit 1; fi
    sleep 0.5
done
grep -q "worker ready" "$log" || { cat "$log" >&2; echo "serve was not ready in 300 s" >&2; exit 1; }
echo "+ ${lines[2]}"
answer=$(bash -c "${lines[2]}")
echo "$answer"
case "$answer" in
    *Paris*) echo "README SmolLM2 block: ok" ;;
    *) echo "README SmolLM2 block: the answer does not name Paris" >&2; exit 1 ;;
esac
