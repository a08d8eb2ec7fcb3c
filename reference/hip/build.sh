#!/bin/sh
# Build the HIP reference kernels for gfx1250/gfx950/gfx942 (clang-22) and sm_90 (nvcc) into
# build/reference/<arch>/. Idempotent (stamped); a missing compiler skips its target. The
# headers they include live in peerdsl/reference/include (always on the include path).
#   reference/hip/build.sh [--arch gfx1250,sm_90] [-o DIR] [--strict] [-I DIR] [FILE.hip ...]
set -e
cd "$(dirname "$0")/../.."
exec python -m peerdsl.reference_build "$@"
