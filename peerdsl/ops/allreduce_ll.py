"""LL all-reduce (SPEC section 3), for inputs up to the LL cap (4 MiB).

Each thread takes 16-byte packs of this rank's input, read in place, and pushes each as two
LL lines {data0, epoch, data1, epoch} into every rank's scratch (bank = epoch parity, region
of the source rank). Then it reads the lines of every rank for the same packs from its own
scratch, accepts a line once both flags equal the epoch, and sums in rank order.

The epoch is one device-side word of the Signal, shared by every LL launch and advanced once
per launch by the last block to finish, so a change of grid between launches can never let a
block accept a stale line.
"""
from .. import dsl, layout
from ..dsl import PeerPtrs, Ptr, constexpr
from ._collective import BLOCK, WORLDS, global_thread, grid_threads, rank_order_sum
from .registry import register


def _wait_line(line, epoch, me, rank):
    """Spin (bounded) until both flag words of the 16-byte line equal the epoch."""
    limit = dsl.spin_limit(me)
    v = dsl.load(line, "system", "relaxed")
    n = 0
    while ((v[1] != epoch) or (v[3] != epoch)) and n < limit:
        v = dsl.load(line, "system", "relaxed")
        n = n + 1
    if (v[1] != epoch) or (v[3] != epoch):
        dsl.record_error(me, rank, layout.WAIT_LL, epoch, v[1])
    return v


def ll_push(x, ll, rank, epoch, bank_base, n_packs, lines_per_peer, W):
    """Push every pack of this thread as two LL lines into every rank's scratch.

    All pushes come before any collect: a thread never waits for peers between its packs,
    so a round trip is paid once per launch, not once per pack."""
    src = x.cast(dsl.i32x4)
    for i in range(global_thread(), n_packs, grid_threads()):
        words = src[i]
        first = dsl.pack([words[0], epoch, words[1], epoch], dsl.i32)
        second = dsl.pack([words[2], epoch, words[3], epoch], dsl.i32)
        slot = bank_base + rank * lines_per_peer + 2 * i
        for r in range(W):
            lines = ll[r].cast(dsl.i32x4)
            dsl.store(lines + slot, first, "system", "relaxed")
            dsl.store(lines + (slot + 1), second, "system", "relaxed")


def ll_collect(out, ll, me, rank, epoch, bank_base, n_packs, lines_per_peer, T, W):
    """Wait for every rank's lines of this thread's packs and sum them in rank order."""
    P = dsl.vec16(T)
    mine = ll[rank].cast(dsl.i32x4)
    for i in range(global_thread(), n_packs, grid_threads()):
        terms = []
        for r in range(W):
            at = bank_base + r * lines_per_peer + 2 * i
            lo = _wait_line(mine + at, epoch, me, rank).bitcast(P)
            hi = _wait_line(mine + (at + 1), epoch, me, rank).bitcast(P)
            terms.append([v.to_f32() for v in (lo[0], lo[1], lo[4], lo[5],
                                               hi[0], hi[1], hi[4], hi[5])])
        out.cast(P)[i] = dsl.pack_rne(rank_order_sum(terms), T)


@dsl.kernel(block_size=BLOCK)
def allreduce_ll(x: Ptr["T"], out: Ptr["T"], sig: PeerPtrs[dsl.i32], ll: PeerPtrs[dsl.i32],
                 rank: dsl.i32, n_packs: dsl.i32, lines_per_peer: dsl.i32,
                 T: constexpr, W: constexpr):
    me = sig[rank]
    epoch = dsl.load(me + layout.SIG_LL_EPOCH) + 1
    bank_base = (epoch & 1) * (W * lines_per_peer)
    ll_push(x, ll, rank, epoch, bank_base, n_packs, lines_per_peer, W)
    ll_collect(out, ll, me, rank, epoch, bank_base, n_packs, lines_per_peer, T, W)
    dsl.barrier()
    if dsl.thread_id() == 0:
        done = dsl.atomic_add(me + layout.SIG_LL_DONE, 1, "agent", "acq_rel")
        if done == dsl.num_blocks() - 1:  # every block of this launch has read the epoch
            dsl.store(me + layout.SIG_LL_DONE, 0, "agent", "relaxed")
            dsl.store(me + layout.SIG_LL_EPOCH, epoch, "agent", "release")


def variants(target):
    return [{"T": T, "W": W} for T in (dsl.bf16, dsl.f16) for W in WORLDS]


register("allreduce_ll", allreduce_ll, variants)
