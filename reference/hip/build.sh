#!/bin/sh
# Build the HIP reference kernels for gfx1250 (clang-22) and sm_90 (nvcc) into
# build/reference/<arch>/. Idempotent (stamped); a missing compiler skips its target.
#   reference/hip/build.sh [--arch gfx1250,sm_90] [-o DIR] [--strict] [FILE.hip ...]
set -e
cd "$(dirname "$0")/../.."
exec python -m peerdsl.reference_build "$@"
