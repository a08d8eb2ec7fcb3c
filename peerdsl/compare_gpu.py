"""`peerdsl compare --run`, the GPU half (sm_90): both kernels on one device, W ranks as W
CUDA streams, on the inputs a recipe made (compare_run.py holds the recipe API, the packing
and the report; this module only loads, launches, reads back and times).

A rank's "peers" are other buffers on the same device, so every peer pointer is an ordinary
device address. Both kernels are loaded through runtime/cuda/loader.py's CudaKernel, and
both take their arguments as bytes packed by PackPlan; the reference launches with the
whole kernarg buffer (CU_LAUNCH_PARAM_BUFFER_POINTER), which needs no per-parameter table.
"""
from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any, Callable

from .compare_run import (CompareError, RunCase, RunContext, RunReport, pack_dsl, pack_ref,
                          ref_entry, same_bytes, signal_errors)
from .runtime.manifest import KernelEntry, Manifest


class RefFunction:
    """The reference symbol of a cubin: the driver's function and its parameter layout."""

    def __init__(self, cubin: Path, symbol: str, device: int):
        import hashlib

        from .runtime.cuda._driver import check, driver
        from .runtime.cuda.loader import _param_layout, ensure_context
        self.cubin, self.symbol, self.device = Path(cubin), symbol, device
        self.data = self.cubin.read_bytes()
        self.sha256 = hashlib.sha256(self.data).hexdigest()
        ensure_context(device)
        drv = driver()
        self.module = check(drv.cuModuleLoadData(self.data), f"cuModuleLoadData({cubin})")
        self.function = check(drv.cuModuleGetFunction(self.module, symbol.encode()),
                              f"cuModuleGetFunction({symbol})")
        found = _param_layout(drv, self.function, 64)  # the driver's word, else the cubin's
        if found:
            self.params, self.size = list(found), max(o + s for o, s in found)
        else:
            from .compare_sides import ref_param_layout
            self.params, self.size = ref_param_layout("sm_90", self.data, symbol)


def occupancy(function: Any, block: int, smem: int = 0) -> int:
    from .runtime.cuda._driver import check, driver
    return int(check(driver().cuOccupancyMaxActiveBlocksPerMultiprocessor(
        function, block, smem), "cuOccupancyMaxActiveBlocksPerMultiprocessor"))


def _time(torch: Any, streams: list[Any], launch_all: Callable[[], None],
          iters: int) -> tuple[float, str]:
    """Mean µs per call of all W ranks. Each call forks the rank streams from one stream and
    joins them back (as a model step would). Timed as replays of a CUDA graph of `iters`
    calls, so Python launch overhead is not measured; eager calls if capture fails."""
    main = torch.cuda.Stream()

    def calls() -> None:
        cur = torch.cuda.current_stream()
        for _ in range(iters):
            fork = torch.cuda.Event()
            fork.record(cur)
            for s in streams:
                s.wait_event(fork)
            launch_all()
            for s in streams:
                join = torch.cuda.Event()
                join.record(s)
                cur.wait_event(join)

    torch.cuda.synchronize()
    t0, t1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    try:
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g, stream=main):
            calls()
        g.replay()  # warm-up
        torch.cuda.synchronize()
        with torch.cuda.stream(main):
            t0.record(main)
            for _ in range(3):
                g.replay()
            t1.record(main)
        torch.cuda.synchronize()
        return t0.elapsed_time(t1) * 1000.0 / (3 * iters), f"CUDA graph of {iters} calls x 3"
    except RuntimeError as e:  # capture not possible here: eager, launch cost included
        print(f"  (graph capture failed: {e}; timing eager launches)")
        torch.cuda.synchronize()
        with torch.cuda.stream(main):
            t0.record(main)
            calls()
            t1.record(main)
        torch.cuda.synchronize()
        return t0.elapsed_time(t1) * 1000.0 / iters, f"eager, {iters} calls"


def _check_case(case: RunCase, world: int) -> None:
    if not isinstance(case, RunCase):
        raise CompareError(f"the recipe returned {type(case).__name__}, expected a RunCase")
    if len(case.dsl_args) != world or len(case.ref_args) != world:
        raise CompareError(f"the recipe gave {len(case.dsl_args)} DSL and {len(case.ref_args)} "
                           f"reference argument sets for W={world} ranks")
    for o in case.outputs:
        if len(o.dsl) != world or len(o.ref) != world:
            raise CompareError(f"output {o.name!r}: needs one tensor per rank on each side")
    if not case.outputs:
        raise CompareError("the recipe names no outputs to compare")
    if not 1 <= int(case.grid) < 1 << 31:
        raise CompareError(f"grid {case.grid} is not a positive block count")


@dataclasses.dataclass
class Prepared:
    """Both sides ready to launch: per rank packed bytes and the kernel objects."""
    dsl: Any                 # CudaKernel of the DSL entry
    ref: Any                 # CudaKernel of the reference (its entry has the foreign layout)
    dsl_bytes: list[bytes]
    ref_bytes: list[bytes]


def load_pair(manifest: Manifest, dsl_entry: KernelEntry, ref_cubin: Path, ref_symbol: str,
              device: int) -> tuple[Any, RefFunction]:
    """The DSL kernel through the manifest's loader, the reference function from its cubin.
    Both launch in buffer mode: the whole packed kernarg buffer, whatever the parameters."""
    from .runtime.cuda.loader import CudaLoader
    dsl = CudaLoader(manifest, device=device, mode="buffer").load(dsl_entry)
    return dsl, RefFunction(ref_cubin, ref_symbol, device)


def prepare(case: RunCase, world: int, dsl: Any, ref: RefFunction) -> Prepared:
    """Check the recipe's case, pack every rank's arguments for both sides (PackPlan), and
    make the reference's CudaKernel from its cubin layout typed by the recipe's values."""
    from .runtime.cuda.loader import CudaKernel
    _check_case(case, world)
    dsl_bytes = [pack_dsl(dsl.entry, a, r) for r, a in enumerate(case.dsl_args)]
    rentry = ref_entry(ref.symbol, ref.cubin, ref.sha256, ref.params, case.ref_args[0],
                       ref.size, case.ref_block or dsl.entry.block_size)
    ref_bytes = [pack_ref(rentry, a) for a in case.ref_args]
    refk = CudaKernel(rentry, ref.device, ref.function, mode="buffer")
    return Prepared(dsl, refk, dsl_bytes, ref_bytes)


def run_compare(manifest: Manifest, dsl_entry: KernelEntry, ref_cubin: Path, ref_symbol: str,
                recipe: Callable[[RunContext], RunCase], *, world: int, grid_limit: int = 0,
                iters: int = 50, options: dict[str, str] | None = None) -> RunReport:
    import torch
    if not torch.cuda.is_available():
        raise CompareError("--run needs a CUDA device (the lent H200); none is visible")
    dev = torch.cuda.current_device()
    dsl, ref = load_pair(manifest, dsl_entry, ref_cubin, ref_symbol, dev)
    block = dsl_entry.block_size
    # every block of every rank must be resident at once (they may wait on each other)
    sms = torch.cuda.get_device_properties(dev).multi_processor_count
    resident = min(occupancy(dsl.function, block, dsl_entry.dynamic_lds_bytes),
                   occupancy(ref.function, block))
    max_grid = max(1, sms * resident // world)
    if grid_limit:
        max_grid = min(max_grid, grid_limit)
    ctx = RunContext(torch=torch, device="cuda", world=world,
                     constexprs=dict(dsl_entry.constexprs), block=block, max_grid=max_grid,
                     options=dict(options or {}))
    case = recipe(ctx)
    p = prepare(case, world, dsl, ref)
    streams = [torch.cuda.Stream() for _ in range(world)]
    grid = int(case.grid)

    def launch_dsl() -> None:
        for r in range(world):
            p.dsl.launch(grid, p.dsl_bytes[r], stream=streams[r])

    def launch_ref() -> None:
        for r in range(world):
            p.ref.launch(grid, p.ref_bytes[r], stream=streams[r])

    torch.cuda.synchronize()
    for s in streams:
        s.wait_stream(torch.cuda.current_stream())  # the recipe's inputs are ready
    launch_dsl()
    launch_ref()
    torch.cuda.synchronize()

    def spin_errors() -> list[str]:
        return [e for side, sigs in case.signals.items() for e in signal_errors(sigs, side)]

    errors = spin_errors()
    results = [(f"{o.name} rank {r}: DSL == reference", same_bytes(o.dsl[r], o.ref[r]))
               for o in case.outputs for r in range(world)]
    results += [(c.label, same_bytes(c.actual, c.expected)) for c in case.checks]
    t_dsl, how = _time(torch, streams, launch_dsl, iters)
    t_ref, _ = _time(torch, streams, launch_ref, iters)
    errors += [e for e in spin_errors() if e not in errors]
    return RunReport(device=torch.cuda.get_device_name(dev), description=case.description,
                     world=world, grid=grid, blocks=(block, p.ref.entry.block_size),
                     results=results, errors=errors, latency_us=(t_dsl, t_ref),
                     timing=f"{how}, fork/join of the rank streams each call")
