"""Run a multi-rank peerdsl program on the CPU simulator.

    import peerdsl.sim
    def fn(comm):                      # comm: peerdsl.runtime.sim.comm.SimCommunicator
        x = comm.register(torch.randn(64, 6144, dtype=torch.bfloat16))  # every rank's x
        out = torch.empty(64, 6144, dtype=torch.bfloat16)
        comm.launch(my_kernel, grid=4, constexprs={"T": "bf16", "W": comm.world},
                    inp=x, out=out, sig=comm.signal, rank=comm.rank, n_packs=64 * 6144 // 8)
        return out                     # the results were copied back into it
    results = peerdsl.sim.run(4, fn, seed=7)   # list of fn's return values, by rank

`seed=None` schedules round-robin (deterministic, mildly weak); an int seeds the random
policy (adversarial interleavings and store delays; collective launch i uses a seed derived
from (seed, i)). `skew`: int (rank r starts r*skew steps late), a list per rank, or a
callable(launch_index) -> list. See comm.py for the communicator API and the other options
(`spin_limit`, `policy`, `ll_max_bytes`, `staging_bytes`, `deadlock_steps`, `max_steps`,
`store_delay`, and `comm_cls`: a SimCommunicator subclass that adds the collective ops).
"""
from __future__ import annotations

import threading
from typing import Any, Callable

from .runtime.errors import SimAborted
from .runtime.sim.comm import SimCommunicator, SimJob

__all__ = ["run", "SimCommunicator", "SimJob"]


def run(tp: int, fn: Callable[[SimCommunicator], Any], seed: int | None = None,
        skew: Any = None, target: str = "gfx1250", **options: Any) -> list:
    """Run fn(comm) on `tp` simulated ranks; return the results by rank, or raise the
    first error (by rank; errors of ranks aborted because another failed come last)."""
    if options.get("comm_cls") is None:  # the full Communicator: collectives included
        from .runtime.sim.collective_comm import SimCollectiveComm
        options["comm_cls"] = SimCollectiveComm
    job = SimJob(tp, target, seed=seed, skew=skew, **options)
    results: list[Any] = [None] * tp
    errors: list[BaseException | None] = [None] * tp

    def body(r: int) -> None:
        try:
            results[r] = fn(job.comms[r])
            job.exit(r)
        except BaseException as e:  # noqa: BLE001 - reported to the caller below
            errors[r] = e
            job.fail(e)

    if tp == 1:
        body(0)
    else:
        threads = [threading.Thread(target=body, args=(r,), name=f"sim-rank{r}", daemon=True)
                   for r in range(tp)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    real = [e for e in errors if e is not None and not isinstance(e, SimAborted)]
    if real:
        raise real[0]
    aborted = [e for e in errors if e is not None]
    if aborted:
        raise aborted[0]
    return results
