"""Issue 14's runtime-only fault cases on the GPU (`scripts/gpu_collectives.py --faults`).

Run inside each rank's process of gpu_collectives.py. Every case builds a fresh, small
Communicator (a failed case leaves it broken: that is the rule), plays its calls on every
rank, and checks: each call returned the exact result or raised a named error, the first
error is the expected kind, every later call raised CommunicatorBroken, and nothing took
longer than the bound. Cases: a rank skipping a call, a call whose input check failed on one
rank, ranks disagreeing on the rows, a rank delayed past the spin limit, epochs started just
below 2^31 and 2^32 (the test hook) with per-rank GPU delays, and calls after close().
"""
from __future__ import annotations

import os
import time
from typing import Any, Callable

MiB = 1 << 20
BOUND_S = 20.0


def _rank_order_sum(torch: Any, xs: list) -> Any:
    acc = xs[0].float()
    for x in xs[1:]:
        acc = acc + x.float()
    return acc.to(xs[0].dtype)


def run_faults(rank: int, world: int, build: str, dev: Any, allocator: str) -> dict:
    import torch
    import torch.distributed as dist
    from peerdsl.runtime.communicator import Communicator
    from peerdsl.runtime.errors import CollectiveError

    report: dict = {"cases": {}, "failures": [], "calls": 0, "exact": 0, "errors": 0,
                    "corruptions": 0}
    delay = None

    def comm_for(timeout_s: float = 1.0) -> Any:
        return Communicator(device=dev, build_dir=build, timeout_s=timeout_s,
                            allocator=allocator, max_size=8 * MiB, ll_max_bytes=1 * MiB,
                            staging_bytes=8 * MiB)

    def gpu_delay(comm: Any, ns: int) -> None:
        nonlocal delay
        from peerdsl.ops.gpu_delay import gpu_delay as _  # noqa: F401 (registered op)
        if delay is None:
            delay = (comm.loader.kernel("gpu_delay"), torch.zeros(1, dtype=torch.int32,
                                                                  device=dev))
        delay[0].launch(1, {"sink": delay[1], "nanoseconds": int(ns)})

    def inputs(i: int, r: int, n: int, dtype: Any = torch.bfloat16) -> Any:
        g = torch.Generator().manual_seed(1000 * i + r)
        return torch.randn(n, generator=g).to(dtype).to(dev)

    def case(name: str, comm: Any, calls: list[Callable[[], bool | None]],
             expect_first: tuple[str, ...] | None) -> None:
        """Play `calls` (each returns True when exact, raises on error); check the rules."""
        outcomes, broken = [], None
        for i, call in enumerate(calls):
            t0 = time.monotonic()
            try:
                status = "exact" if call() in (True, None) else "wrong"
            except CollectiveError as e:
                status = type(e).__name__
            except (ValueError, TypeError) as e:  # the input checks: before any launch
                status = f"bad input ({type(e).__name__})"
            took = time.monotonic() - t0
            if took > BOUND_S:
                report["failures"].append(f"{name}: call {i} took {took:.1f} s")
            if broken is not None and status not in ("CommunicatorBroken", "CommunicatorClosed"):
                report["failures"].append(f"{name}: call {i} after {broken}: {status}")
            if broken is None and status not in ("exact", "wrong") and \
                    not status.startswith("bad"):
                broken = status
            outcomes.append(status)
        report["calls"] += len(outcomes)
        report["exact"] += outcomes.count("exact")
        report["corruptions"] += outcomes.count("wrong")
        report["errors"] += sum(o not in ("exact", "wrong") for o in outcomes)
        if "wrong" in outcomes:
            report["failures"].append(f"{name}: a wrong result without an error: {outcomes}")
        first = next((o for o in outcomes if o not in ("exact", "wrong")
                      and not o.startswith("bad")), None)
        if expect_first is not None and first not in expect_first:
            report["failures"].append(f"{name}: first error {first}, expected {expect_first}")
        elif expect_first is None and first is not None:
            report["failures"].append(f"{name}: unexpected {first}: {outcomes}")
        report["cases"][name] = outcomes
        torch.cuda.synchronize(dev)
        try:
            comm.close()
        except Exception as e:  # noqa: BLE001 - reported, the next case goes on
            report["failures"].append(f"{name}: close() raised {e!r}")
        dist.barrier()

    def ar(comm: Any, i: int, n: int, dtype: Any = torch.bfloat16, bad: bool = False):
        def call() -> bool:
            x = inputs(i, rank, n, dtype)
            got = comm.all_reduce(x.float() if bad else x)
            want = _rank_order_sum(torch, [inputs(i, r, n, dtype) for r in range(world)])
            return torch.equal(got.view(torch.uint8), want.view(torch.uint8))
        return call

    def fused(comm: Any, i: int, rows: int, hidden: int = 6144):
        def call() -> bool:
            xs = [inputs(i, r, rows * hidden).view(rows, hidden) for r in range(world)]
            res = inputs(i, 99, rows * hidden).view(rows, hidden)
            w = inputs(i, 98, hidden).abs() + 0.5
            _, res_out = comm.fused_allreduce_rmsnorm(xs[rank], res, w.to(torch.bfloat16))
            want = (_rank_order_sum(torch, xs).float() + res.float()).to(torch.bfloat16)
            return torch.equal(res_out, want)
        return call

    last = world - 1
    # Beyond two ranks, a rank may meet the abort mark of a peer that saw the other call's tag
    # first (that peer raised CollectiveMismatch) before it sees the tag itself
    mismatch = ("CollectiveMismatch",) if world == 2 else ("CollectiveMismatch",
                                                           "CollectiveAborted")
    one_stage = {"PEERDSL_LL_MAX_BYTES": "0"}  # the plain all-reduce through Signal barriers
    with _env(one_stage):
        c = comm_for()
        calls = [ar(c, 0, 4096), ar(c, 1, 8192), ar(c, 2, 4096), ar(c, 3, 8192)]
        if rank == last:
            calls.pop(1)
        case("a rank skips a call (one-stage)", c, calls, mismatch)
    c = comm_for()
    calls = [ar(c, 0, 2048), ar(c, 1, 4096), ar(c, 2, 3072), ar(c, 3, 2048)]
    if rank == last:
        calls.pop(1)
    case("a rank skips a call (LL)", c, calls, mismatch)
    c = comm_for()
    calls = [ar(c, i, 4096, bad=(rank == last and i == 1)) for i in range(4)]
    case("input check failed on one rank (LL)", c, calls, mismatch)
    c = comm_for()
    calls = [fused(c, 0, 16), fused(c, 1, 64 if rank != last else 32), fused(c, 2, 16)]
    case("rows 64 vs 32 (fused)", c, calls, mismatch)

    for label, env in (("one-stage", one_stage), ("LL", {})):
        with _env(env):
            c = comm_for(timeout_s=0.2)

            def late(i: int, c: Any = c) -> Callable[[], bool]:
                inner = ar(c, i, 4096)

                def call() -> bool:
                    if rank == last and i == 1:
                        gpu_delay(c, 2_000_000_000)  # 2 s: ten times the spin limit
                    return inner()
                return call
            want = ("CollectiveTimeout", "CollectiveAborted", None) if rank == last else \
                ("CollectiveTimeout",)
            case(f"a rank delayed past the spin limit ({label})", c,
                 [late(i) for i in range(3)], want)

    gen = torch.Generator().manual_seed(7)
    for start in (2**31 - 2, 2**31 - 5, 2**32 - 2, 2**32 - 5):
        c = comm_for()
        c.set_epochs_for_test(start)
        calls = []
        for i in range(24):
            ns = int(torch.randint(0, 50_000, (world,), generator=gen)[rank])

            def call(i: int = i, ns: int = ns, c: Any = c) -> bool:
                gpu_delay(c, ns)
                if i % 3 == 0:
                    return fused(c, i, 384)()
                return ar(c, i, 2048 if i % 3 == 1 else 384 * 6144)()
            calls.append(call)
        case(f"epochs from {start:#x}", c, calls, None)

    c = comm_for()
    x = inputs(0, rank, 2048)

    def after_close() -> bool:
        c.close()
        c.close()
        return True
    case("calls after close()", c,
         [ar(c, 0, 2048), after_close, lambda: c.all_reduce(x), lambda: c.null_collective()],
         ("CommunicatorClosed",))
    return report


class _env:
    """Set environment variables for the block (this process is one rank)."""

    def __init__(self, values: dict[str, str]):
        self.values, self.old = values, {}

    def __enter__(self) -> None:
        for k, v in self.values.items():
            self.old[k] = os.environ.get(k)
            os.environ[k] = v

    def __exit__(self, *exc: Any) -> None:
        for k, v in self.old.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
