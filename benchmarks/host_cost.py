"""Host-side cost of one eager `Communicator.fused_allreduce_rmsnorm`, on a CPU machine.

    PYTHONPATH=. python3 benchmarks/host_cost.py [--build build] [--cases 2:ll+rmsnorm 2 16]

The real Communicator, dispatch, CudaLoader and kernarg packing run against the sm_90
manifest; only the edges are replaced: the CUDA driver by a stub whose calls return at once
(cuda-bindings is not needed), torch.distributed by a one-process fake (rank 1 of 4), the
IPC export/open by fake addresses, and device memory by CPU tensors (the input pool by a
"meta" tensor: a copy into it costs torch's dispatch, as the host side of a GPU's
asynchronous copy does, not a memcpy of the data). So the figure is the
Python cost of dispatch + argument packing + launch with no GPU work and no driver time:
on a GPU add the driver's own launch cost (a few us per kernel). As in
benchmarks/bench_ar_rms.py (the H200 figures), the Communicator is built with
check_errors=False: with True every eager collective ends in a synchronizing read of its
error word, i.e. waits for the GPU (`--check-errors` measures that read's host part here).

Prints the median us per call (TP4, H=6144 bf16) for each case, ROWS or ROWS:PATH (PATH
forced through PEERDSL_FUSED_PATH: sm_90 dispatch takes no fused LL path by default), the
path taken, and a cProfile top list, twice per case: the plain eager call and the prepared
call of the same arguments (`comm.prepare_fused_allreduce_rmsnorm`, runtime/prepared.py:
checked, planned and packed once; each call patches the tag and makes one driver launch). Without a manifest under --build, the needed ops are built first.
"""
from __future__ import annotations

import argparse
import contextlib
import cProfile
import enum
import io
import json
import os
import pstats
import statistics
import sys
import time
import types
from collections.abc import Callable, Iterator
from typing import Any
from unittest import mock

if "PYTHONPATH" not in os.environ:  # else measure the peerdsl it names (A/B runs)
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

OPS = ["allreduce_ll", "add_rmsnorm", "fused_ar_rms_1stage", "fused_ar_rms_2stage",
       "per_token_quant_fp8"]


class CUresult(enum.IntEnum):
    CUDA_SUCCESS = 0
    CUDA_ERROR_INVALID_VALUE = 1
    CUDA_ERROR_NOT_SUPPORTED = 801


class StubDriver:
    """The few `cuda.bindings.driver` calls the loader makes, each returning at once with
    results shaped like cuda-bindings' (an error enum first). Launches are only counted."""

    CUresult = CUresult
    CUfunction_attribute = types.SimpleNamespace(
        CU_FUNC_ATTRIBUTE_MAX_THREADS_PER_BLOCK=0, CU_FUNC_ATTRIBUTE_SHARED_SIZE_BYTES=1,
        CU_FUNC_ATTRIBUTE_LOCAL_SIZE_BYTES=3, CU_FUNC_ATTRIBUTE_NUM_REGS=4,
        CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES=8)
    CU_LAUNCH_PARAM_BUFFER_POINTER, CU_LAUNCH_PARAM_BUFFER_SIZE, CU_LAUNCH_PARAM_END = 1, 2, 0
    _OK = CUresult.CUDA_SUCCESS

    def __init__(self) -> None:
        self.launches = 0
        self._ctx = 0

    def cuInit(self, flags):
        return (self._OK,)

    def cuDeviceGet(self, ordinal):
        return self._OK, 100 + ordinal

    def cuDevicePrimaryCtxRetain(self, dev):
        return self._OK, 0xC000 + int(dev)

    def cuCtxGetCurrent(self):
        return self._OK, self._ctx

    def cuCtxSetCurrent(self, ctx):
        self._ctx = ctx
        return (self._OK,)

    def cuModuleLoadData(self, image):
        return self._OK, 0x4000

    def cuModuleGetFunction(self, module, name):
        return self._OK, 0x5000 + len(name)

    def cuFuncGetAttribute(self, attr, func):
        return self._OK, (1024 if int(attr) == 0 else 0)

    def cuFuncGetParamInfo(self, func, i):
        return CUresult.CUDA_ERROR_NOT_SUPPORTED, 0, 0  # as an older driver: check skipped

    def cuFuncSetAttribute(self, func, attr, value):
        return (self._OK,)

    def cuOccupancyMaxActiveBlocksPerMultiprocessor(self, func, block, smem):
        return self._OK, 2

    def cuLaunchKernel(self, f, gx, gy, gz, bx, by, bz, smem, stream, params, extra):
        self.launches += 1
        return (self._OK,)

    def cuGetErrorString(self, err):
        return self._OK, b"stub"


def ensure_manifest(build: str) -> str:
    if not os.path.exists(os.path.join(build, "sm_90", "manifest.json")):
        from peerdsl.lowering.build import build as build_ops
        print(f"building {OPS} for sm_90 into {build} ...", file=sys.stderr, flush=True)
        build_ops("sm_90", OPS, build)
    return build


@contextlib.contextmanager
def cpu_communicator(build: str, world: int = 4, rank: int = 1,
                     check_errors: bool = False) -> Iterator[Any]:
    """A Communicator whose GPU, driver, IPC and process group are CPU stand-ins."""
    import torch

    from peerdsl.runtime import communicator as cm
    from peerdsl.runtime.cuda import _driver, clear_caches, ipc
    fake_dist = types.SimpleNamespace(
        get_rank=lambda g=None: rank, get_world_size=lambda g=None: world,
        all_gather_object=lambda out, obj, group=None: out.__setitem__(slice(None),
                                                                        [obj] * world),
        barrier=lambda group=None: None, get_backend=lambda g=None: "gloo")
    opened = iter(range(1, 100))
    drv = StubDriver()
    with contextlib.ExitStack() as st:
        for target, attr, value in (
                (torch, "distributed", fake_dist),
                (cm, "_arch_of", lambda d: "sm_90"),
                (torch.cuda, "get_device_properties",
                 lambda d: types.SimpleNamespace(multi_processor_count=132)),
                (torch.cuda, "device_count", lambda: 1),
                (torch.cuda, "synchronize", lambda d=None: None),
                (ipc, "ipc_export", lambda t, n, device=0: ipc.IpcHandle(b"h" * 64, 0, n)),
                (ipc, "ipc_open", lambda h, device=0: next(opened) << 32)):
            st.enter_context(mock.patch.object(target, attr, value, create=True))
        st.enter_context(mock.patch.dict(sys.modules, {"torch.distributed": fake_dist}))
        st.enter_context(mock.patch.dict(os.environ, {"PEERDSL_BUILD_DIR": build}))
        st.enter_context(_driver.use_driver(drv))
        clear_caches()
        comm = cm.Communicator(device="cpu", check_errors=check_errors)
        comm._pool = torch.empty(comm.max_size, dtype=torch.uint8, device="meta")
        comm.stub_driver = drv
        try:
            yield comm
        finally:
            clear_caches()


def median_us(call: Callable[[], Any], iters: int, rounds: int) -> dict[str, float]:
    """us per call: the median over all calls (wall clock and this thread's CPU time), and
    the lowest of the per-round wall medians, which a shared machine's slow spells (they
    come and go over seconds here) disturb least."""
    for _ in range(max(5, iters // 20)):  # warm: kernels loaded, plans compiled
        call()
    wall, cpu, best = [], [], float("inf")
    perf, thread = time.perf_counter_ns, time.thread_time_ns
    for _ in range(rounds):
        part = []
        for _ in range(max(1, iters // rounds)):
            t0, c0 = perf(), thread()
            call()
            c1, t1 = thread(), perf()
            part.append((t1 - t0) / 1e3)
            cpu.append((c1 - c0) / 1e3)
        wall += part
        best = min(best, statistics.median(part))
    return {"us": statistics.median(wall), "cpu_us": statistics.median(cpu), "best_us": best}


def profile(call: Callable[[], Any], iters: int, top: int) -> tuple[str, int]:
    prof = cProfile.Profile()
    prof.enable()
    for _ in range(iters):
        call()
    prof.disable()
    stats = pstats.Stats(prof, stream=(text := io.StringIO()))
    calls = sum(v[1] for v in stats.stats.values()) // iters  # type: ignore[attr-defined]
    stats.sort_stats("tottime").print_stats(top)
    return text.getvalue(), calls


def measure(build: str, cases: list[str], hidden: int, world: int, iters: int,
            rounds: int, top: int, check_errors: bool) -> dict[str, Any]:
    import torch
    out: dict[str, Any] = {"world": world, "hidden": hidden, "check_errors": check_errors,
                           "rows": {}}
    with cpu_communicator(build, world=world, check_errors=check_errors) as comm:
        for case in cases:
            rows = int(case.split(":")[0])
            forced = {"PEERDSL_FUSED_PATH": case.split(":")[1]} if ":" in case else {}
            g = torch.Generator().manual_seed(rows)
            x = torch.randn(rows, hidden, generator=g).to(torch.bfloat16)
            res = torch.randn(rows, hidden, generator=g).to(torch.bfloat16)
            w = (torch.rand(hidden, generator=g) + 0.5).to(torch.bfloat16)

            def call(x=x, res=res, w=w):
                return comm.fused_allreduce_rmsnorm(x, res, w)
            with mock.patch.dict(os.environ, forced):
                # the prepared call of the same arguments (issue 15): planned and packed once
                prepared = comm.prepare_fused_allreduce_rmsnorm(x, res, w)
                for kind, fn in (("plain", call), ("prepared", prepared)):
                    fn()
                    n0 = comm.stub_driver.launches
                    fn()
                    r = {"rows": rows, "kind": kind, "path": comm.last_path,
                         "launches": comm.stub_driver.launches - n0}
                    r.update(median_us(fn, iters, rounds))
                    r["profile"], r["py_calls"] = profile(fn, max(50, iters // 4), top)
                    out["rows"][f"{case} {kind}"] = r
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--build", default=os.environ.get("PEERDSL_BUILD_DIR", "build"))
    ap.add_argument("--cases", nargs="+", default=["2:ll+rmsnorm", "2", "16"])
    ap.add_argument("--hidden", type=int, default=6144)
    ap.add_argument("--world", type=int, default=4)
    ap.add_argument("--iters", type=int, default=2000)
    ap.add_argument("--rounds", type=int, default=10)
    ap.add_argument("--top", type=int, default=25)
    ap.add_argument("--check-errors", action="store_true",
                    help="Communicator(check_errors=True): read the error word after launches")
    ap.add_argument("--json", default=None)
    args = ap.parse_args()
    import torch
    # One intra-op thread: an OpenMP team on a busy 2-core machine turns the CPU stand-ins of
    # device work into ms-long stalls that a GPU's asynchronous work would not have.
    torch.set_num_threads(1)
    import peerdsl
    print(f"peerdsl from {os.path.dirname(peerdsl.__file__)}", file=sys.stderr)
    build = ensure_manifest(args.build)
    res = measure(build, args.cases, args.hidden, args.world, args.iters, args.rounds,
                  args.top, args.check_errors)
    for case, r in res["rows"].items():
        print(f"\n==== TP{res['world']} H={res['hidden']} bf16 {case}: path {r['path']}, "
              f"{r['launches']} launches, {r['py_calls']} Python calls")
        print(r["profile"])
    print(f"host cost per eager fused call (median of {args.iters}, check_errors="
          f"{res['check_errors']}):")
    for case, r in res["rows"].items():
        print(f"  TP{res['world']} H={res['hidden']} rows={r['rows']:<3} {r['kind']:<8} "
              f"{r['path']:<13} median {r['us']:6.1f} us (CPU {r['cpu_us']:6.1f}), best round "
              f"{r['best_us']:6.1f} us, {r['launches']} launch(es), {r['py_calls']} Python calls")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(res, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
