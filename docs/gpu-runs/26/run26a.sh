#!/usr/bin/env bash
# Run 26, calls A and B: each stashes one part of SmolLM2's GGUF (a call carries at most 64 MiB,
# the tree included) in /tmp/smol, where call C, on the same warm machine, finds them.
#   A: carry .gpu26/bins.tar.xz .gpu26/smol.part00;  B: carry .gpu26/smol.part01
set -uo pipefail
cd "$(dirname "$0")/../../.."
mkdir -p /tmp/smol && cp .gpu26/* /tmp/smol/
ls -la /tmp/smol; nvidia-smi --query-gpu=name,memory.used --format=csv
