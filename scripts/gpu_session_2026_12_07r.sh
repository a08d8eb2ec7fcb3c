#!/usr/bin/env bash
# Device call P3 (2026-12-07, third session). Hidden sizes past 8192 (runtime-H bounds MAXH
# 12288 and 16384), never timed: at TP4 dispatch sends them to the two-stage kernel from
# 768 KiB, with the default schedule (U0V1E1: their other schedules spilled), which is the
# slowest two-stage schedule at every size swept so far. Forced-path sweeps at H = 10240,
# 12288 and 16384, TP4 and TP2, 16-2048 rows, against the vLLM AR + Triton pair, twice.
# Carry build and peers_src.
W=/tmp/p3; TAG=p3; source scripts/session_steps.sh
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv,noheader
for r in 1 2; do
  forced_sweep sweep_r$r 240 "16 64 256 1024 2048" "4 2" "10240 12288 16384"
done
true
