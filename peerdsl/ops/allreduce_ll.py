"""LL all-reduce (SPEC section 3), for inputs up to the LL cap (4 MiB).

Each thread takes 16-byte packs of this rank's input, read in place, and pushes each as two
LL lines {data0, epoch, data1, epoch ^ tag} into every rank's scratch (bank = epoch parity,
region of the source rank). Then it reads the lines of every rank for the same packs from its
own scratch (every rank's line of a half pack read at once, then polling only a line not
there yet), accepts a line once its flags are {epoch, epoch ^ tag} (each 8-byte half carries
one, so a torn line is never accepted), and sums in rank order.

The epoch is one device-side counter of the Signal, shared by every LL launch and advanced
once per launch for every block index at once (layout.SIG_LL_EPOCH: a copy per block index;
block b of a G-block launch reads copy b and writes the next epoch into copies b, b + G, ...,
which no other block of the launch reads), so a change of grid between launches can never let
a block accept a stale line, and advancing it costs no atomic and no fence: the launch
boundary publishes the copies to the next launch. It is never 0 (zeroed scratch never
matches) and keeps alternating banks across the 2^32 wrap. The tag (`dsl.CallId`: the call's identity) in the
second flag makes a line of another call a detected mismatch, never a silently summed term;
a rank whose error record was set when the launch started pushes its lines with TAG_ABORT, so
peers raise instead of summing what may be garbage. Graph replays repeat the tag but the
device epoch still advances, so each replay's lines stay distinct.
"""
from .. import dsl, layout
from ..dsl import PeerPtrs, Ptr, constexpr
from ._collective import BLOCK, WORLDS, global_thread, grid_threads, rank_order_sum
from .registry import register

MISMATCH_POLLS = 2  # polls in a row that see this epoch with another tag: a mismatch (one
                    # could be a line whose halves are still landing)



def next_ll_epoch(stored):
    """The epoch after `stored`: +1, but 0 is skipped (zeroed lines would match) by going to
    2, so the parity, and with it the bank, still alternates across the wrap."""
    epoch = stored + 1
    return dsl.select(epoch == 0, 2, epoch)


def _accepted(v, epoch, want):
    """Both flag words of line `v` are this call's: {epoch, epoch ^ tag}."""
    return (v[1] == epoch) & (v[3] == want)


def _reread_unless_accepted(line, v, epoch, want):
    if not _accepted(v, epoch, want):
        v = dsl.load(line, "system", "relaxed")
    return v


def _all(conds):
    ok = conds[0]
    for c in conds[1:]:
        ok = ok & c
    return ok


def _wait_lines(lines, vs, epoch, tag, limit, me, rank):
    """The W lines of a half pack (rank order) as first read are `vs`; unless every one is
    accepted already, spin (bounded), each poll re-reading every line not yet accepted: where
    the target keeps polls in flight together (sm_90), the wait ends one round trip after the
    last peer's line lands, not one per peer that was late on the first read. A
    line of this epoch with another tag, seen MISMATCH_POLLS polls in a row, ends the wait as
    a mismatch (or an abort, when the peer's tag carries TAG_ABORT); the spin also stops once
    any wait of this rank has failed. The record names the first line, in rank order, of
    another call if there is one (the evidence of a mismatch or an abort: a peer that is
    merely late beside it is not the cause), else the first line not accepted (a timeout).
    Returns the lines (garbage unless accepted: the record says so)."""
    want = epoch ^ tag
    if not _all([_accepted(v, epoch, want) for v in vs]):
        err = me + layout.SIG_ERROR
        odd = [((v[1] == epoch) & (v[3] != want)).zext(dsl.i32) for v in vs]
        n = 0
        stop = 0
        while (not _all([_accepted(v, epoch, want) for v in vs])) and (n < limit) and \
                _all([o < MISMATCH_POLLS for o in odd]) and (stop == 0):
            vs = [_reread_unless_accepted(line, v, epoch, want) for line, v in zip(lines, vs)]
            stop = dsl.load(err, "system", "relaxed")
            odd = [dsl.select((v[1] == epoch) & (v[3] != want), o + 1, 0)
                   for v, o in zip(vs, odd)]
            n = n + 1
        _record_first_failed_line(vs, epoch, want, tag, me, rank)
    return vs


def _record_first_failed_line(vs, epoch, want, tag, me, rank):
    """Write the record for the line that explains the failed wait (see _wait_lines)."""
    late, other = -1, -1          # the first line not there yet / of another call
    late_seen, late_flag, other_flag = 0, 0, 0
    for peer in reversed(range(len(vs))):   # selects in reverse: the lowest rank wins
        v = vs[peer]
        is_other = (v[1] == epoch) & (v[3] != want)
        is_late = v[1] != epoch
        other = dsl.select(is_other, peer, other)
        other_flag = dsl.select(is_other, v[3], other_flag)
        late = dsl.select(is_late, peer, late)
        late_seen = dsl.select(is_late, v[1], late_seen)
        late_flag = dsl.select(is_late, v[3], late_flag)
    if other >= 0:
        peer_tag = other_flag ^ epoch
        dsl.record_error(me, rank, layout.WAIT_LL, epoch, epoch,
                         dsl.select((peer_tag ^ tag) == layout.TAG_ABORT,
                                    layout.CAUSE_ABORTED, layout.CAUSE_MISMATCH),
                         other, tag, peer_tag)
    if (other < 0) & (late >= 0):
        dsl.record_error(me, rank, layout.WAIT_LL, epoch, late_seen, layout.CAUSE_TIMEOUT,
                         late, tag, late_flag ^ epoch)


def ll_push(x, ll, rank, epoch, bank_base, n_packs, lines_per_peer, W, tag=0):
    """Push every pack of this thread as two LL lines into every rank's scratch.

    All pushes come before any collect: a thread never waits for peers between its packs,
    so a round trip is paid once per launch, not once per pack."""
    src = x.cast(dsl.i32x4)
    for i in range(global_thread(), n_packs, grid_threads()):
        ll_push_pack(src[i], i, ll, rank, epoch, epoch ^ tag, bank_base, lines_per_peer, W)


def ll_push_pack(words, i, ll, rank, epoch, flag2, bank_base, lines_per_peer, W):
    """Pack i of this rank (`words`: its 16 bytes as i32x4) as lines 2i and 2i + 1 of this
    rank's region of the bank, in every rank's scratch."""
    first = dsl.pack([words[0], epoch, words[1], flag2], dsl.i32)
    second = dsl.pack([words[2], epoch, words[3], flag2], dsl.i32)
    slot = bank_base + rank * lines_per_peer + 2 * i
    for r in range(W):
        lines = ll[r].cast(dsl.i32x4)
        dsl.store(lines + slot, first, "system", "relaxed")
        dsl.store(lines + (slot + 1), second, "system", "relaxed")


def ll_regions(ll, rank, bank_base, lines_per_peer, W):
    """Rank r's region of this bank in this rank's scratch, for every r: uniform pointers
    (scalar registers), one offset per line."""
    mine = ll[rank].cast(dsl.i32x4)
    return [mine + (bank_base + r * lines_per_peer) for r in range(W)]


def ll_half_lines(regions, i, half):
    """Every rank's line `half` of pack i (half 0 carries elements 0-3, half 1 4-7)."""
    return [region + (2 * i + half) for region in regions]


def ll_first_reads(lines):
    return [dsl.load(line, "system", "relaxed") for line in lines]


def ll_half_sum(lines, first, epoch, tag, limit, me, rank, T):
    """The lines of a half pack as first read (`first`), waited for (_wait_lines) and summed
    in rank order (f32)."""
    P = dsl.vec16(T)
    got = [v.bitcast(P) for v in _wait_lines(lines, first, epoch, tag, limit, me, rank)]
    return rank_order_sum([[v.to_f32() for v in (g[0], g[1], g[4], g[5])] for g in got])


def ll_collect(out, ll, me, rank, epoch, bank_base, n_packs, lines_per_peer, T, W, tag=0,
               limit=None):
    """Wait for every rank's lines of this thread's packs and sum them in rank order.

    A half pack at a time (line 0 carries elements 0-3, line 1 elements 4-7): every rank's
    line of the half is read before any is waited for, and every poll re-reads the W lines
    together (`_wait_lines`), so the loads are in flight at once. Each element is summed
    over the ranks in order, so a half at a time gives the same bits; storing each half as
    soon as it is summed keeps one half's lines in registers, not all 2W."""
    half_pack = dsl.ir.VectorType(T, 4)
    if limit is None:
        limit = dsl.spin_limit(me)
    regions = ll_regions(ll, rank, bank_base, lines_per_peer, W)
    for i in range(global_thread(), n_packs, grid_threads()):
        for half in range(2):
            lines = ll_half_lines(regions, i, half)
            sums = ll_half_sum(lines, ll_first_reads(lines), epoch, tag, limit, me, rank, T)
            out.cast(half_pack)[2 * i + half] = dsl.pack_rne(sums, T)


@dsl.kernel(block_size=BLOCK)
def allreduce_ll(x: Ptr["T"], out: Ptr["T"], sig: PeerPtrs[dsl.i32], ll: PeerPtrs[dsl.i32],
                 rank: dsl.i32, n_packs: dsl.i32, lines_per_peer: dsl.i32, call: dsl.CallId,
                 T: constexpr, W: constexpr):
    me = sig[rank]
    epoch = next_ll_epoch(dsl.load(me + (layout.SIG_LL_EPOCH + dsl.block_id())))
    # the record and the limit as the launch found them (plain loads beside the epoch's)
    sticky = dsl.load(me + layout.SIG_ERROR)
    limit = dsl.load(me + layout.SIG_SPIN_LIMIT)
    bank_base = (epoch & 1) * (W * lines_per_peer)
    ll_push(x, ll, rank, epoch, bank_base, n_packs, lines_per_peer, W,
            dsl.select(sticky == 0, call, call | layout.TAG_ABORT))
    ll_collect(out, ll, me, rank, epoch, bank_base, n_packs, lines_per_peer, T, W, call,
               dsl.select(sticky == 0, limit, 0))
    advance_ll_epoch(me, epoch)


def advance_ll_epoch(me, epoch):
    """Store `epoch` into this block's copy of the LL epoch and every copy past the grid in
    its residue class (block b of G: b, b + G, b + 2G, ...), once every thread of the block
    has read copy b: together the launch's blocks cover every copy, each written by one block
    and read by no other block of the launch. (One store per thread where the launch has at
    least MAX_BLOCKS threads.)"""
    dsl.barrier()
    for copy in range(dsl.block_id() + dsl.thread_id() * dsl.num_blocks(), layout.MAX_BLOCKS,
                      dsl.num_blocks() * dsl.block_size()):
        dsl.store(me + (layout.SIG_LL_EPOCH + copy), epoch)


def variants(target):
    return [{"T": T, "W": W} for T in (dsl.bf16, dsl.f16) for W in WORLDS]


register("allreduce_ll", allreduce_ll, variants)
