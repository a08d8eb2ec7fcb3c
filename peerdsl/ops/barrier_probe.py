"""GPU proof of cross-block, cross-rank synchronization (system-scope atomics + Signal).

One launch per rank (processes, or streams of one process), each with `grid` blocks, all
ranks sharing `counter` (one i32 on one rank) and each rank's peer-visible `slots`.
`stamp` is unique per round (the host counts rounds: 1, 2, ...).

Phase 1 (atomics): thread 0 of every block of every rank adds 1 to `counter` (system,
acq_rel) and spins with acquire loads until it reaches `counter_target`
(= rounds so far x world x grid), bounded by the Signal's spin limit.
Phase 2 (Signal): each block publishes `stamp * 16 + rank` in its rank's slots[block]
(system release), crosses Signal.start, reads slots[block] of every rank (system acquire),
crosses Signal.end. out[2 * block] = 1 if phase 1 completed, out[2 * block + 1] = how many
ranks' slots held this round's stamp: `world` when the barriers are correct.
"""
from .. import dsl, layout
from ..dsl import PeerPtrs, Ptr, constexpr
from .registry import register

BLOCK = 64


@dsl.kernel(block_size=BLOCK)
def barrier_probe(sig: PeerPtrs[dsl.i32], slots: PeerPtrs[dsl.i32], counter: Ptr[dsl.i32],
                  out: Ptr[dsl.i32], rank: dsl.i32, counter_target: dsl.i32, stamp: dsl.i32,
                  W: constexpr):
    b = dsl.block_id()
    t = dsl.thread_id()
    ok = 1
    if t == 0:
        dsl.atomic_add(counter, 1, "system", "acq_rel")
        ok = dsl.spin_until_ge(counter, counter_target, sig[rank], rank, layout.WAIT_FLAG)
        dsl.store(slots[rank] + b, stamp * 16 + rank, "system", "release")
    dsl.barrier()
    s = dsl.Signal(sig, rank, W)
    s.start()
    seen = 0
    if t == 0:
        for r in range(W):
            v = dsl.load(slots[r] + b, "system", "acquire")
            seen = seen + (v == stamp * 16 + r).to_i32()
    s.end()
    if t == 0:
        out[2 * b] = ok
        out[2 * b + 1] = seen


def variants(target):
    return [{"W": w} for w in (2, 4, 8)]


register("barrier_probe", barrier_probe, variants)
