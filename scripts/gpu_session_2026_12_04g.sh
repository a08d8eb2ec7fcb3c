#!/usr/bin/env bash
# H200 call G9 (2026-12-04): dispatch's own choice beside the unfused pair run as a caller runs
# it (all-reduce, then add + RMSNorm, in one graph; bench_ar_rms.py pair_us), TP4 and TP2,
# H 2880, 6144, 8192. (The call that ran was TP4 at 6144 and 2880 only: one start was refused
# and the device budget was nearly spent.)
TAG=g9 exec bash "$(dirname "$0")/gpu_session_2026_12_04f.sh"
