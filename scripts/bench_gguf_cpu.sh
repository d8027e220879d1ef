#!/usr/bin/env bash
# ringserve against llama.cpp on the same GGUF file and the same CPU cores, both measured offline
# the same way: a batch of N sequences, each with a P-token prompt, generating G tokens; decode
# tok/s = N x G / generation time (ringserve `bench engine`, llama.cpp `llama-batched-bench`).
#
#   scripts/bench_gguf_cpu.sh LLAMA_BATCHED_BENCH [GGUF] [THREADS]
#
# LLAMA_BATCHED_BENCH: llama.cpp's llama-batched-bench, e.g. built from the llama.cpp that
# llama-cpp-python's PyPI sdist vendors:
#   python3 -m pip download --no-deps --no-binary :all: llama-cpp-python   # then unpack it
#   cmake -B build -DCMAKE_BUILD_TYPE=Release -DGGML_NATIVE=ON -DLLAMA_CURL=OFF vendor/llama.cpp
#   cmake --build build -j --target llama-batched-bench
# Not run in CI: numbers need a quiet machine.
set -euo pipefail
cd "$(dirname "$0")/.."
bench=$1
gguf=${2:-models/SmolLM2-135M-Instruct.Q4_1.gguf}
threads=${3:-$(nproc)}
P=128 G=64
cargo build --release --quiet
echo "== ringserve ($threads threads), $gguf"
RAYON_NUM_THREADS=$threads target/release/ringserve bench engine --model "$gguf" --device cpu \
    --batch-sizes 1,16 --prompt-lens $P --output-len $G 2>/dev/null
echo "== llama.cpp llama-batched-bench ($threads threads), $gguf"
"$bench" -m "$gguf" -c 4096 -b 2048 -ub 512 -npp $P -ntg $G -npl 1,16 -t "$threads" 2>/dev/null
