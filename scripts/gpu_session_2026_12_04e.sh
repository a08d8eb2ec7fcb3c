#!/usr/bin/env bash
# H200 call G6 (2026-12-04): call G5's steps again after the gfx1250 merge (sm_90 IR changed:
# the gemma add, wide LDS reads) and the runtime-H split: dispatch's own choice at TP4 and
# TP2 (H 2880, 6144, 8192), runtime-H against specialized, and the collectives proof.
TAG=g6 exec bash "$(dirname "$0")/gpu_session_2026_12_04d.sh"
