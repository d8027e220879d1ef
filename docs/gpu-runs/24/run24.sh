#!/usr/bin/env bash
# Run 24: the INT4 kernel and model tests again after run 23's two fixes (warp-uniform partial
# k-steps; one act order per fused group in the GPTQ fixtures), including the per-step-scale (g128)
# GEMV variant; and the SmolLM2-shaped GGUF path is not needed here (GGUF weights load as f32).
set -uo pipefail
cd "$(dirname "$0")/../../.."
D=.gpu24
tar xJf $D/bins.tar.xz -C $D
export LD_LIBRARY_PATH=/usr/local/cuda/lib64 RINGSERVE_KERNEL_CACHE=/tmp/kc-24 FIXTURES_DIR=$PWD/tests/fixtures
nvidia-smi -L
echo "== kernel tests"
timeout 240 $D/cuda_int4 --include-ignored --test-threads 1 --nocapture int4_kernels > $OUT/kernels.log 2>&1; echo "rc=$?"
grep -vE "^\s+[0-9]+:|^\s+at " $OUT/kernels.log | tail -14
echo "== model tests"
timeout 120 $D/cuda_int4 --include-ignored --test-threads 1 --nocapture int4_models > $OUT/models.log 2>&1; echo "rc=$?"
grep -E "rel L2|test result|panicked|backend on|refused" $OUT/models.log | head -30
