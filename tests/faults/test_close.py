"""Issue 14 item 5: close() is idempotent and every later call raises CommunicatorClosed
before it launches or writes anything: the LL path never launches with the cached peer
addresses of freed memory (in the simulator that launch would be a memory fault: close()
frees the meta buffer), and the VMM allocator never frees a mapping twice."""
from __future__ import annotations

import types

import pytest
import torch

from fault_harness import Step, run_case, statuses

STEPS = [Step("ar", 1024), Step("fused", 4), Step("ar", 1024), Step("fused", 4), Step("null"),
         Step("ag", 256)]


@pytest.mark.parametrize("who", ["every rank", "rank 1"])
def test_calls_after_close_raise_before_any_launch(who):
    launches = {}

    def before(comm, i):
        if i == 2 and (who == "every rank" or comm.rank == 1):
            launches[comm.rank] = comm.job.launches
            comm.close()
            comm.close()   # idempotent
    res = run_case(f"calls after close() on {who} (TP2)", 2, STEPS, before=before)
    st = statuses(res)
    closed = [0, 1] if who == "every rank" else [1]
    for r in closed:
        assert st[r] == ["exact", "exact"] + ["CommunicatorClosed"] * 4, st
    if who == "every rank":   # and nothing was launched after close()
        assert res[0][0].error is None and launches[0] == launches[1]
    else:   # the open rank's next call cannot meet its closed peer: a named error
        assert st[0][2] in ("SimPeerGone", "SimRendezvousTimeout"), st


def test_local_calls_after_close_raise_too():
    import peerdsl.sim
    from peerdsl.runtime.errors import CommunicatorClosed

    def body(comm):
        x = torch.ones(2, 2880, dtype=torch.bfloat16)
        comm.close()
        for call in (lambda: comm.add_rmsnorm(x, x, x[0]), lambda: comm.all_reduce(x),
                     lambda: comm.set_epochs_for_test(5)):
            with pytest.raises(CommunicatorClosed):
                call()
        return comm.job.launches
    assert peerdsl.sim.run(2, body) == [0, 0]


class _FailingDriver:
    """cuMemAddressFree fails once; counts every call."""

    def __init__(self):
        self.calls = []

    def __getattr__(self, name):
        def call(*args):
            self.calls.append(name)
            return (1 if name == "cuMemAddressFree" else 0,)
        return call


def test_vmm_free_never_frees_twice(monkeypatch):
    from peerdsl.runtime.cuda import vmm
    drv = _FailingDriver()
    monkeypatch.setattr(vmm, "driver", lambda: drv)
    monkeypatch.setattr(vmm, "ensure_context", lambda d: None)
    monkeypatch.setattr(vmm, "check", lambda res, what: (_ for _ in ()).throw(
        RuntimeError(what)) if res[0] else None)
    alloc = vmm.VmmAllocation(1 << 40, 1 << 21, types.SimpleNamespace(), 0, False)
    with pytest.raises(RuntimeError, match="cuMemAddressFree"):
        vmm.vmm_free(alloc)
    vmm.vmm_free(alloc)            # a second close(): nothing is unmapped or released again
    assert drv.calls == ["cuMemUnmap", "cuMemAddressFree"] and alloc.freed
