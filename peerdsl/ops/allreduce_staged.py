"""One-stage all-reduce with one barrier: every rank copies its input into one half of its
staging halves (layout.MetaLayout.halves_offset), crosses the start barrier (a release: the
copy is visible to the peers), then reads every rank's half and sums in rank order (SPEC
2.1): the bytes of allreduce_1stage, with no end barrier.

Why no end barrier is needed (SPEC section 3: a peer must not overwrite what another rank
still reads). The half is the parity of the launch epoch (the Signal's LL epoch copies,
advanced once per launch of this kernel and of the LL kernels, for every block index at once),
so two such launches in a row use different halves whatever their grids. A rank writes a half
again only two epochs later, after its stream finished a launch in between that advanced the
epoch: that launch waited for every peer (here every block's start barrier waits for every
rank; the LL kernels accept a line of every rank), which no peer reaches before its launch
that read the half had finished (stream order). The next launch's start barrier thus does
what the end barrier did, as for allreduce_2stage with E = 0. The input is read in place (no
copy into the registered pool), so neither an eager call nor a graph registers anything.

U packs per thread per iteration and B threads per block are constexprs, as in
allreduce_1stage (`_collective.unrolled_grid_stride`, `ar_variants`).
"""
from .. import dsl, layout
from ..dsl import PeerPtrs, Ptr, constexpr
from ._collective import BLOCK, ar_variants, peer_packs, rank_order_sum, unrolled_grid_stride
from .allreduce_ll import advance_ll_epoch, next_ll_epoch
from .registry import register


@dsl.kernel(block_size="B")
def allreduce_staged(x: Ptr["T"], halves: PeerPtrs["T"], out: Ptr["T"], sig: PeerPtrs[dsl.i32],
                     rank: dsl.i32, n_packs: dsl.i32, half_packs: dsl.i32, call: dsl.CallId,
                     T: constexpr, W: constexpr, U: constexpr = 1, B: constexpr = BLOCK):
    # half_packs: the packs one half holds (n_packs <= half_packs: the host checks)
    me = sig[rank]
    epoch = next_ll_epoch(dsl.load(me + (layout.SIG_LL_EPOCH + dsl.block_id())))
    stage_and_sum(dsl.Signal(sig, rank, W, call=call), x, halves, out, rank, n_packs,
                  (epoch & 1) * half_packs, T, W, U)
    advance_ll_epoch(me, epoch)


def stage_and_sum(signal, x, halves, out, rank, n_packs, base, T, W, U) -> None:
    """The kernel body, given its Signal and the half's first pack `base` (a test passes a
    constant one to show what the parity protects)."""
    P = dsl.vec16(T)
    src, mine, dst = x.cast(P), halves[rank].cast(P), out.cast(P)
    # the same grid-stride index set per thread as the reads below: block b's start barrier
    # covers exactly the packs block b of every rank reads
    unrolled_grid_stride(n_packs, U, lambda i: src[i],
                         lambda i, v: mine.__setitem__(base + i, v))
    signal.start()
    unrolled_grid_stride(signal.bound(n_packs), U,
                         lambda i: dsl.pack_rne(rank_order_sum(peer_packs(halves, P, W,
                                                                          base + i)), T),
                         dst.__setitem__)
    signal.finish()


register("allreduce_staged", allreduce_staged, ar_variants)
