#!/usr/bin/env bash
# Run 27, call A (carry .gpu27/a: bins.tar.xz and smol.part00): stashes the binaries and the first
# part of SmolLM2's GGUF in /tmp/smol, then runs worker/tests/cuda_int4.rs — the INT4 kernels with
# and without Q4_1 offsets at odd shapes, the five INT4 fixtures, and tests/fixtures/gguf-q4
# (Q4_0 and Q4_1 layers) on the INT4 kernels and dequantized, each against the CPU.
# Call B carries .gpu27/b (smol.part01) and stops after the stash.
set -uo pipefail
cd "$(dirname "$0")/../../.."
mkdir -p /tmp/smol && cp .gpu27/*/* /tmp/smol/ && ls -la /tmp/smol
[ -f .gpu27/a/bins.tar.xz ] || exit 0
S=/tmp/smol
tar xJf $S/bins.tar.xz -C $S
export FIXTURES_DIR=$PWD/tests/fixtures LD_LIBRARY_PATH=/usr/local/cuda/lib64 RINGSERVE_CUDA_INCLUDE=/usr/local/cuda/include RINGSERVE_KERNEL_CACHE=/tmp/kc-27
nvidia-smi --query-gpu=name,memory.used --format=csv
timeout 400 $S/cuda_int4 --include-ignored --nocapture --test-threads=1 2>&1 | tee $OUT/cuda_int4.log | grep -vE "^shape " | tail -60
