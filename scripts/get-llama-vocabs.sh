#!/usr/bin/env bash
# Fetches llama.cpp's tokenizer test vectors — vocabulary-only GGUF files with `.inp` texts and
# `.out` ids made by the original tokenizers — for Llama 2 and Phi-3 (SentencePiece) and Llama 3,
# Qwen2 and GPT-2 (byte-level BPE), from the llama.cpp that PyPI's llama-cpp-python 0.3.36 sdist
# vendors, into models/llama-vocabs (or $1); prints the folder. Nothing is built or installed.
#   RINGSERVE_LLAMA_VOCABS=$(scripts/get-llama-vocabs.sh) cargo test --release -p worker --test gguf
set -euo pipefail
dest=${1:-"$(cd "$(dirname "$0")/.." && pwd)/models/llama-vocabs"}
version=0.3.36
sha256=832db0699007f1be95a7e41ef12e88926b02ba836461e36a36372db2760c1a2e
names="llama-spm phi-3 llama-bpe qwen2 gpt-2"
if [ -f "$dest/.complete-$version" ]; then
    echo "$dest"
    exit 0
fi
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
# The sdist's address from PyPI's JSON API (resolved against it: a mirror may answer relative URLs).
url=$(python3 - "$version" <<'PY'
import json, sys, urllib.parse, urllib.request
api = "https://pypi.org/pypi/llama-cpp-python/json"
info = json.load(urllib.request.urlopen(api))
files = (info.get("releases") or {}).get(sys.argv[1]) or (
    info["urls"] if info["info"]["version"] == sys.argv[1] else [])
print(next(urllib.parse.urljoin(api, u["url"]) for u in files if u["packagetype"] == "sdist"))
PY
)
curl -sSfL -o "$tmp/sdist.tar.gz" "$url"
echo "$sha256  $tmp/sdist.tar.gz" | sha256sum --check --status ||
    { echo "get-llama-vocabs: the sdist does not have the expected sha256 $sha256" >&2; exit 1; }
members=()
for n in $names; do
    for ext in gguf gguf.inp gguf.out; do
        members+=("llama_cpp_python-$version/vendor/llama.cpp/models/ggml-vocab-$n.$ext")
    done
done
tar -xzf "$tmp/sdist.tar.gz" -C "$tmp" "${members[@]}"
mkdir -p "$dest"
mv "$tmp/llama_cpp_python-$version/vendor/llama.cpp/models/"* "$dest/"
touch "$dest/.complete-$version"
echo "$dest"
