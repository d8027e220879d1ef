#!/usr/bin/env bash
# Run 26, call A: stashes the first part of SmolLM2's GGUF (a call carries at most 64 MiB) in
# /tmp/smol, where call B, on the same warm machine, finds it.
set -uo pipefail
cd "$(dirname "$0")/../../.."
mkdir -p /tmp/smol && cp .gpu26/smol.part00 /tmp/smol/ && cp .gpu26/bins.tar.xz /tmp/smol/
ls -la /tmp/smol; nvidia-smi --query-gpu=name,memory.used --format=csv
