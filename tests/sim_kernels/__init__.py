"""Deliberately broken kernels beside their correct twins, written with peerdsl.dsl only.

Each protocol bug the simulator must catch (tests/test_sim_protocols.py):
  (a) `ar_staged(start_barrier=False)`: reads peers' staged inputs without the start barrier.
      `ar_staged(stage_barrier=False)`: has the start barrier, but no block barrier between
      every wave's staging stores and wave 0's release in it: other waves' packs may land
      after the peers were let in.
  (b) `flag_publish(release=False)`: data and flag both relaxed; the flag may land first.
      `flag_publish(acquire=False)`: the reader polls the flag relaxed, so its plain data
      loads are not ordered after the flag and may return old data.
      `flag_publish(scope="agent")`: an agent-scope release orders the data only for blocks
      of the writer's device; the peer rank may see the flag first. Its twin
      `flag_publish_local(scope="agent")` (writer and reader on one device) is correct.
  (c) `ar_staged(own_counter=True)`: shares the Signal's barrier slots but keeps its own
      epoch counters elsewhere (the seed bug): its epochs are below what the slots hold, so
      `>=` passes at once and it reads peers' staging before they staged it.
  (d) `ll_allreduce(shared_epoch=False)`: LL lines accepted by a per-block epoch; when the
      grid size changes between launches a block's epoch repeats one a peer's line already
      carries in that bank, and a stale line is accepted.
Also shared-memory and barrier twins (`two_block_sums`, `divergent_barrier`), the benchmark
kernel `ar_direct`, and `run1`, a one-device launch helper for the tests.
"""
import peerdsl.dsl as dsl
from peerdsl import layout
from peerdsl.ops.allreduce_ll import advance_ll_epoch
from peerdsl.runtime.sim import SimSystem


def run1(kernel, args: dict, inputs: dict, outputs: dict, grid: int = 1, seed=None):
    """Launch on one simulated device; inputs: name -> tensor; outputs: name -> (shape, dtype)."""
    dev = SimSystem(1).devices[0]
    bufs = {k: dev.to_device(v) for k, v in inputs.items()}
    bufs.update({k: dev.alloc_tensor(s, d) for k, (s, d) in outputs.items()})
    dev.launch(kernel, grid, {**args, **bufs}, seed=seed)
    return {k: dev.to_torch(bufs[k]) for k in outputs}


class OwnCounterSignal(dsl.Signal):
    """BROKEN on purpose: the Signal's barrier slots, but epochs kept in `ctr[block]`."""

    def __init__(self, sig, rank, world, ctr):
        super().__init__(sig, rank, world)
        self._epoch_ptr = ctr + self.block
        self._base = dsl.load(self._epoch_ptr)


class WaveReleaseSignal(dsl.Signal):
    """BROKEN on purpose: start() releases without the block barrier that dsl.Signal puts
    first, so only the releasing wave's staged packs are covered."""

    def start(self):
        self._barrier(layout.WAIT_START)


@dsl.kernel(block_size=64)
def ar_staged(sig: dsl.PeerPtrs[dsl.i32], stage: dsl.PeerPtrs['T'], inp: dsl.Ptr['T'],
              out: dsl.Ptr['T'], ctr: dsl.Ptr[dsl.i32], rank: dsl.i32, npacks: dsl.i32,
              T: dsl.constexpr, world: dsl.constexpr, start_barrier: dsl.constexpr = True,
              own_counter: dsl.constexpr = False, stage_barrier: dsl.constexpr = True):
    """One-stage all-reduce through a staging buffer: stage own input, start barrier, sum the
    peers' staged packs in rank order, end barrier (staging may be overwritten after it)."""
    if own_counter:
        s = OwnCounterSignal(sig, rank, world, ctr)
    elif not stage_barrier:
        s = WaveReleaseSignal(sig, rank, world)
    else:
        s = dsl.Signal(sig, rank, world)
    P = dsl.vec16(T)
    first = dsl.block_id() * dsl.block_size() + dsl.thread_id()
    step = dsl.num_blocks() * dsl.block_size()
    for i in range(first, npacks, step):
        stage[rank].cast(P)[i] = inp.cast(P)[i]
    if start_barrier:
        if stage_barrier:
            dsl.barrier()  # every wave's staged packs before wave 0's release (cumulativity)
        s.start()
    for i in range(first, npacks, step):
        acc = stage[0].cast(P)[i].to_f32()
        for r in range(1, world):
            v = stage[r].cast(P)[i].to_f32()
            acc = [a + b for a, b in zip(acc, v)]
        out.cast(P)[i] = dsl.pack_rne(acc, T)
    s.end()


@dsl.kernel(block_size=64)
def flag_publish(data: dsl.PeerPtrs[dsl.i32], flag: dsl.PeerPtrs[dsl.i32],
                 sig: dsl.PeerPtrs[dsl.i32], out: dsl.Ptr[dsl.i32], rank: dsl.i32,
                 n: dsl.i32, epoch: dsl.i32, release: dsl.constexpr = True,
                 acquire: dsl.constexpr = True, scope: dsl.constexpr = "system"):
    """Rank 0 writes n words into rank 1's `data`, then raises rank 1's flag to `epoch`;
    rank 1 waits for the flag (acquire) and copies data to `out`. One block."""
    t = dsl.thread_id()
    if rank == 0:
        for i in range(t, n, dsl.block_size()):
            dsl.store(data[1] + i, epoch * 1000 + i, "system", "relaxed")
        dsl.barrier()
        if t == 0:
            if release:
                dsl.store(flag[1], epoch, scope, "release")
            else:
                dsl.store(flag[1], epoch, "system", "relaxed")
    if rank == 1:
        if t == 0:
            if acquire:
                dsl.spin_until_ge(flag[1], epoch, sig[1], rank, layout.WAIT_FLAG)
            else:
                seen = dsl.load(flag[1], "system", "relaxed")
                k = 0
                while (seen < epoch) and (k < 100000):
                    seen = dsl.load(flag[1], "system", "relaxed")
                    k = k + 1
        dsl.barrier()
        for i in range(t, n, dsl.block_size()):
            out[i] = dsl.load(data[1] + i)


@dsl.kernel(block_size=64)
def flag_publish_local(data: dsl.Ptr[dsl.i32], flag: dsl.Ptr[dsl.i32], out: dsl.Ptr[dsl.i32],
                       n: dsl.i32, epoch: dsl.i32, scope: dsl.constexpr = "agent"):
    """Block 0 writes n words (plain stores) and releases the flag at `scope`; block 1 of the
    same device acquires it at `scope` and copies the data to `out`. Grid 2."""
    t = dsl.thread_id()
    if dsl.block_id() == 0:
        for i in range(t, n, dsl.block_size()):
            data[i] = epoch * 1000 + i
        dsl.barrier()
        if t == 0:
            dsl.store(flag, epoch, scope, "release")
    else:
        if t == 0:
            seen = dsl.load(flag, scope, "acquire")
            k = 0
            while (seen < epoch) and (k < 100000):
                seen = dsl.load(flag, scope, "acquire")
                k = k + 1
        dsl.barrier()
        for i in range(t, n, dsl.block_size()):
            out[i] = data[i]


@dsl.kernel(block_size=32)
def ll_allreduce(sig: dsl.PeerPtrs[dsl.i32], ll: dsl.PeerPtrs[dsl.i32], inp: dsl.Ptr[dsl.i32],
                 out: dsl.Ptr[dsl.i32], rank: dsl.i32,
                 nlines: dsl.i32, world: dsl.constexpr, shared_epoch: dsl.constexpr = True):
    """LL all-reduce of 2*nlines i32 words. Line i of source rank r on rank p lives at
    ll[p] + ((bank * world + r) * nlines + i) * 4 words, as {d0, flag, d1, flag} written with
    one 16-byte system-scope store; a reader accepts it once both flags equal its epoch.
    `ll` points at the LL scratch of each rank."""
    me = sig[rank]
    if shared_epoch:
        epoch = dsl.load(me + (layout.SIG_LL_EPOCH + dsl.block_id())) + 1
    else:
        block_epoch = me + (layout.SIG_EPOCH + dsl.block_id())
        epoch = dsl.load(block_epoch) + 1  # per-block: BROKEN when the grid size changes
    bank = epoch & 1
    first = dsl.block_id() * dsl.block_size() + dsl.thread_id()
    step = dsl.num_blocks() * dsl.block_size()
    V = dsl.i32x4
    for i in range(first, nlines, step):
        line = dsl.pack([inp[2 * i], epoch, inp[2 * i + 1], epoch], dsl.i32)
        for p in range(world):
            dst = ll[p] + ((bank * world + rank) * nlines + i) * 4
            dsl.store(dst.cast(V), line, "system", "relaxed")
    for i in range(first, nlines, step):
        s0 = 0
        s1 = 0
        for r in range(world):
            src = (ll[rank] + ((bank * world + r) * nlines + i) * 4).cast(V)
            v = dsl.load(src, "system", "relaxed")
            n = 0
            limit = dsl.load(me + layout.SIG_SPIN_LIMIT)
            while ((v[1] != epoch) or (v[3] != epoch)) and (n < limit):
                v = dsl.load(src, "system", "relaxed")
                n = n + 1
            if (v[1] != epoch) or (v[3] != epoch):
                dsl.record_error(me, rank, layout.WAIT_LL, epoch, v[1])
            s0 = s0 + v[0]
            s1 = s1 + v[2]
        out[2 * i] = s0
        out[2 * i + 1] = s1
    if shared_epoch:  # the one LL epoch, advanced in every block's copy at once
        advance_ll_epoch(me, epoch)
    else:
        dsl.barrier()
        if dsl.thread_id() == 0:
            dsl.store(block_epoch, epoch)


@dsl.kernel(block_size=256)
def ar_direct(sig: dsl.PeerPtrs[dsl.i32], inp: dsl.PeerPtrs['T'], out: dsl.Ptr['T'],
              rank: dsl.i32, npacks: dsl.i32, T: dsl.constexpr, world: dsl.constexpr):
    """One-stage all-reduce of registered inputs read in place (the benchmark kernel):
    start barrier, 16-byte packs of every peer summed in f32 in rank order, end barrier."""
    s = dsl.Signal(sig, rank, world)
    s.start()
    P = dsl.vec16(T)
    first = dsl.block_id() * dsl.block_size() + dsl.thread_id()
    step = dsl.num_blocks() * dsl.block_size()
    for i in range(first, npacks, step):
        acc = inp[0].cast(P)[i].to_f32()
        for r in range(1, world):
            v = inp[r].cast(P)[i].to_f32()
            acc = [a + b for a, b in zip(acc, v)]
        out.cast(P)[i] = dsl.pack_rne(acc, T)
    s.end()


def _reduce_twin(x, first_barrier, second_barrier):
    """lib.block_reduce written out, with either of its barriers optionally left out."""
    x = dsl.group_reduce(x, lambda a, b: a + b)
    scratch = dsl.shared_array("twin_scratch", dsl.f32, 32, reuse=True)
    if dsl.lane_id() == 0:
        scratch[dsl.thread_id() >> 5] = x
    if first_barrier:
        dsl.barrier()
    total = scratch[0]
    for g in range(1, dsl.block_size() // 32):
        total = total + scratch[g]
    if second_barrier:
        dsl.barrier()
    return total


@dsl.kernel(block_size=128)
def two_block_sums(x: dsl.Ptr[dsl.f32], out: dsl.Ptr[dsl.f32],
                   first_barrier: dsl.constexpr = True, second_barrier: dsl.constexpr = True):
    """Two block sums through one shared scratch. Without the first barrier a wave reads
    partials other waves have not written; without the second the next sum overwrites
    partials other waves may still be reading. The simulator's race detector flags both."""
    t = dsl.thread_id()
    v = x[t]
    a = _reduce_twin(v, first_barrier, second_barrier)
    b = _reduce_twin(v * v, first_barrier, second_barrier)
    out[t] = a
    out[128 + t] = b


@dsl.kernel(block_size=64)
def divergent_barrier(out: dsl.Ptr[dsl.i32], uniform: dsl.constexpr = True):
    """A barrier under a condition that is (or is not) the same for the whole block."""
    t = dsl.thread_id()
    c = dsl.block_id() == 0 if uniform else t < 32
    if c:
        dsl.barrier()
    out[t] = t
