"""bench_ar_rms.py's forced-path sweep (BENCH_SWEEP=1): every fused path and schedule the
build holds, forced in turn on every rank through the PEERDSL_* variables, each one's bytes
compared with the unfused path's and each one timed as bench_ar_rms.py times dispatch's path.
"""
from __future__ import annotations

import os

from benchmarks.rank_harness import graph_time_us


# the environment variable each schedule key of a swept path sets (R: the one-stage
# kernel's rows per iteration, `fused_ar_rms_1stage_rows`)
SCHEDULE_ENV = {"U": "PEERDSL_FUSED_UNROLL", "V": "PEERDSL_FUSED_ROWS",
                "E": "PEERDSL_FUSED_END_BARRIER", "S": "PEERDSL_FUSED_SPLIT",
                "R": "PEERDSL_FUSED_1STAGE_ROWS"}
FUSED_ENV = ("PEERDSL_FUSED_PATH", "PEERDSL_LL_MAX_BYTES", *SCHEDULE_ENV.values())


def fused_schedules(hidden: int, world: int, runtime_h: bool = False) -> list[dict[str, int]]:
    """Every fused two-stage schedule the sm_90 build holds for `hidden` and `world`: a size
    that is not specialized (or any, `runtime_h`: the communicator's force_runtime_h) runs
    the runtime-H kernel of its bound MAXH, at NORM_BLOCK."""
    from peerdsl.lowering.targets import get_target
    from peerdsl.ops._row_slots import NORM_BLOCK, kernel_size, norm_block
    from peerdsl.ops.fused_ar_rms_2stage import schedules
    sm90 = get_target("sm_90")
    size, runtime_h = kernel_size(hidden, runtime_h)
    return schedules(sm90, size, world, NORM_BLOCK if runtime_h else norm_block(sm90, size))


def one_stage_rows(hidden: int, world: int, runtime_h: bool = False) -> list[dict[str, int]]:
    """The one-stage kernel's rows per iteration the sm_90 build holds beyond 1 ({R: V}):
    none where the runtime-H kernels are forced (the rows kernel is specialized only)."""
    from peerdsl.ops.fused_ar_rms_1stage import rows_in_flight
    return [] if runtime_h else [{"R": v} for v in rows_in_flight(hidden, world)]


def forced_paths(torch, comm, x, res, w, dev, sync) -> dict:
    """us per fused call on each path forced through PEERDSL_FUSED_PATH (LL allowed up to its
    4 MiB scratch), the one-stage kernel also with each built V rows per iteration
    (`fused_1stage:R2`), the two-stage kernel in each of its schedules (`fused_2stage:U4V2E0`).
    Every rank forces the same paths in the same order. Each result is compared byte for
    byte with the first path's, the unfused one (all-reduce, then add + RMSNorm); a
    differing path is listed under "mismatch"."""
    saved = {k: os.environ.get(k) for k in FUSED_ENV}
    got, first, mismatch = {}, None, []
    sm90 = comm.arch == "sm_90"
    runtime_h = getattr(comm, "force_runtime_h", False)
    # the unfused path first: every fused path's bytes are checked against it (SPEC 2.3)
    runs = [("unfused", {}), ("ll+rmsnorm", {}), ("fused_1stage", {"R": 1} if sm90 else {})] + [
        ("fused_1stage", s) for s in (one_stage_rows(x.shape[1], comm.world, runtime_h)
                                      if sm90 else [])
    ] + [("fused_2stage", s) for s in (fused_schedules(x.shape[1], comm.world, runtime_h)
                                       if sm90 else [{}])]
    try:
        os.environ["PEERDSL_LL_MAX_BYTES"] = str(comm.meta_layout.ll_max_bytes)
        for path, sched in runs:
            os.environ["PEERDSL_FUSED_PATH"] = path
            for key, name in SCHEDULE_ENV.items():
                if key in sched:
                    os.environ[name] = str(sched[key])
                else:
                    os.environ.pop(name, None)
            # the plain one-stage kernel keeps its bare label (R1 forced: not the rows one)
            tag = "".join(f"{k}{v}" for k, v in sched.items() if (k, v) != ("R", 1))
            label = path + (":" + tag if tag else "")
            try:
                result = comm.fused_allreduce_rmsnorm(x, res, w)
            except ValueError:  # not valid for this shape or world
                continue
            outs = [t.clone() for t in (result.out, result.residual_out)]
            if first is None:
                first = outs
            elif not all(torch.equal(a.view(torch.int16), b.view(torch.int16))
                         for a, b in zip(first, outs)):
                mismatch.append(label)
            got[label + "_us"] = graph_time_us(
                torch, lambda: comm.fused_allreduce_rmsnorm(x, res, w), dev, sync,
                comm.graph_capture)
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
    if mismatch:
        got["mismatch"] = mismatch
    return got
