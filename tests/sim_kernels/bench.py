"""Simulator speed: TP4 one-stage all-reduce of 64 x 6144 bf16 (python -m tests.sim_kernels.bench)."""
import time

import torch

import peerdsl.dsl as dsl
import peerdsl.sim
from . import ar_direct

ROWS, H, TP, GRID = 64, 6144, 4, 4


def main(seed=None) -> float:
    def fn(comm):
        torch.manual_seed(comm.rank)
        x = torch.randn(ROWS, H).to(torch.bfloat16)
        xb = comm.to_device(x)
        out = comm.alloc((ROWS, H), torch.bfloat16)
        ptrs = comm.register(xb)
        kern = ar_direct.trace(T=dsl.bf16, world=comm.world)
        comm.barrier()
        t0 = time.perf_counter()
        comm.launch_ir(kern, None, GRID, dict(sig=comm.peer_signals, inp=ptrs, out=out,
                                           rank=comm.rank, npacks=ROWS * H // 8))
        dt = time.perf_counter() - t0
        xs = comm.exchange(x)
        ref = xs[0].float()
        for r in range(1, comm.world):
            ref = ref + xs[r].float()
        assert torch.equal(comm.to_torch(out), ref.to(torch.bfloat16))
        return dt
    return max(peerdsl.sim.run(TP, fn, seed=seed))


if __name__ == "__main__":
    for seed in (None, 1):
        print(f"TP{TP} all-reduce {ROWS}x{H} bf16, grid {GRID}x256, seed={seed}: "
              f"{main(seed):.2f} s")
