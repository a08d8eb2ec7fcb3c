#!/usr/bin/env bash
# Put the peers' sources that benchmarks/peer_vllm.py builds on the GPU machine into
# peers_src/ (git-ignored; carried to the device with the build): vLLM's custom all-reduce
# header as FlashInfer vendors it. They are measured, never part of peerdsl.
#
#   scripts/peer_sources.sh [FLASHINFER_CHECKOUT_OR_GIT_DIR]
set -euo pipefail
cd "$(dirname "$0")/.."
src=${1:-/work/.mirror/flashinfer-ai+flashinfer/repo}
path=include/flashinfer/comm/vllm_custom_all_reduce.cuh
mkdir -p peers_src
if [ -f "$src/$path" ]; then
    cp "$src/$path" peers_src/vllm_custom_all_reduce.cuh
    commit=$(git -C "$src" rev-parse HEAD 2>/dev/null || echo unknown)
else  # a bare mirror: read the file from its HEAD
    git -C "$src" show "HEAD:$path" > peers_src/vllm_custom_all_reduce.cuh
    commit=$(git -C "$src" rev-parse HEAD)
fi
echo "flashinfer $commit $path" > peers_src/SOURCES
cat peers_src/SOURCES
