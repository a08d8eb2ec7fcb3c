"""`comm.launch` on the simulator: user kernels written in the test, launched by kernel or by
op name with plain torch CPU tensors, exact results; every bad argument named."""
from __future__ import annotations

import pytest
import torch

import peerdsl.sim
from peerdsl import dsl
from peerdsl.dsl import PeerPtrs, Ptr, RegisteredPtrs, constexpr
from peerdsl.ops.registry import register
from peerdsl.runtime.launch_args import LaunchArgError
from peerdsl.runtime.peer_buffers import PeerBuffer

BLOCK = 64
ROWS, H = 8, 64                 # 512 bf16 = 64 packs per rank
PACKS = ROWS * H // 8


@dsl.kernel(block_size=BLOCK)
def allreduce_scale(inp: PeerPtrs["T"], out: Ptr["T"], sig: PeerPtrs[dsl.i32], rank: dsl.i32,
                    n_packs: dsl.i32, scale: dsl.f32, T: constexpr, W: constexpr):
    signal = dsl.Signal(sig, rank, W)
    signal.start()
    P = dsl.vec16(T)
    for i in range(dsl.block_id() * BLOCK + dsl.thread_id(), n_packs, dsl.num_blocks() * BLOCK):
        acc = inp[0].cast(P)[i].to_f32()
        for r in range(1, W):
            acc = [a + b for a, b in zip(acc, inp[r].cast(P)[i].to_f32())]
        out.cast(P)[i] = dsl.pack_rne([a * scale for a in acc], T)
    signal.end()


@dsl.kernel(block_size=BLOCK)
def push_gather(x: Ptr["T"], dst: PeerPtrs["T"], sig: PeerPtrs[dsl.i32], rank: dsl.i32,
                n_packs: dsl.i32, T: constexpr, W: constexpr):
    """Every rank stores its x into slot `rank` of every rank's dst (a peer_buffer)."""
    signal = dsl.Signal(sig, rank, W)
    signal.start()
    P = dsl.vec16(T)
    for i in range(dsl.block_id() * BLOCK + dsl.thread_id(), n_packs, dsl.num_blocks() * BLOCK):
        v = x.cast(P)[i]
        for r in range(W):
            dsl.store(dst[r].cast(P) + (rank * n_packs + i), v, "system", "relaxed")
    signal.end()


@dsl.kernel(block_size=BLOCK)
def local_axpy(x: Ptr[dsl.f32], y: Ptr[dsl.f32], a: dsl.f32, n: dsl.i32):
    """No peers: each rank runs it alone (y = a * x + y)."""
    i = dsl.block_id() * BLOCK + dsl.thread_id()
    if i < n:
        y[i] = a * x[i] + y[i]


@dsl.kernel(block_size=BLOCK)
def two_registered(a: RegisteredPtrs[dsl.f32], b: RegisteredPtrs[dsl.f32], out: Ptr[dsl.f32],
                   sig: PeerPtrs[dsl.i32], rank: dsl.i32, n: dsl.i32, W: constexpr):
    signal = dsl.Signal(sig, rank, W)
    signal.start()
    i = dsl.block_id() * BLOCK + dsl.thread_id()
    if i < n:
        out[i] = a[1 - rank][i] + b[1 - rank][i]   # the other rank's a and b
    signal.end()


@dsl.kernel(block_size=BLOCK)
def ring_put(mine: Ptr[dsl.f32], dst: PeerPtrs[dsl.f32], sig: PeerPtrs[dsl.i32], rank: dsl.i32,
             W: constexpr):
    """Writes word 0 of its own buffer through a Ptr and word 1 of the next rank's through
    PeerPtrs: both must land in the one buffer."""
    signal = dsl.Signal(sig, rank, W)
    signal.start()
    if dsl.thread_id() == 0:
        mine[0] = (rank + 1).to_f32()
        dsl.store(dst[(rank + 1) % W] + 1, (rank + 10).to_f32(), "system", "relaxed")
    signal.end()


register("test_user_allreduce_scale", allreduce_scale, lambda target: [])


def inputs(rank: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(1000 + rank)
    return torch.randn(ROWS, H, generator=g).to(torch.bfloat16)


def reference(world: int, scale: float) -> torch.Tensor:
    acc = inputs(0).float()
    for r in range(1, world):
        acc = acc + inputs(r).float()   # rank order, f32: what the kernel does
    return (acc * scale).to(torch.bfloat16)



def _comm_cls(world: int):
    """A user kernel runs at any world on the simulator through the plain SimCommunicator;
    the collective communicator refuses worlds its shipped kernels are not built for."""
    from peerdsl.runtime.sim.comm import SimCommunicator
    return None if world in (2, 4, 8) else SimCommunicator

@pytest.mark.parametrize("world, seed, skew", [(2, 3, None), (2, 11, 40), (3, 5, 17)])
def test_allreduce_scale_by_kernel_exact(world, seed, skew):
    def fn(comm):
        x = inputs(comm.rank)
        inp = comm.register(x)
        assert isinstance(inp, PeerBuffer) and len(inp) == world and inp.tensor is x
        out = torch.zeros(ROWS, H, dtype=torch.bfloat16)
        comm.launch(allreduce_scale, grid=2, constexprs={"T": torch.bfloat16, "W": world},
                    inp=inp, out=out, sig=comm.signal, rank=comm.rank, n_packs=PACKS,
                    scale=0.5)
        # a second launch with an int for the f32 (Python ints convert), the grid changed
        out2 = torch.zeros_like(out)
        comm.launch(allreduce_scale, grid=3, constexprs={"T": "bf16", "W": world},
                    inp=inp, out=out2, sig=comm.signal, rank=comm.rank, n_packs=PACKS, scale=3)
        return out, out2, x

    results = peerdsl.sim.run(world, fn, seed=seed, skew=skew, comm_cls=_comm_cls(world))
    for r, (out, out2, x) in enumerate(results):
        assert torch.equal(out.view(torch.int16), reference(world, 0.5).view(torch.int16))
        assert torch.equal(out2.view(torch.int16), reference(world, 3.0).view(torch.int16))
        assert torch.equal(x, inputs(r))   # the registered input is unchanged


def test_launch_by_op_name_and_registered_ptrs_staged_or_registered():
    """By name: a user op of the registry, and a shipped RegisteredPtrs kernel whose input is
    a plain tensor (staged like the collectives stage theirs) or a registered PeerBuffer."""
    def fn(comm):
        x = inputs(comm.rank)
        out = torch.zeros_like(x)
        comm.launch("test_user_allreduce_scale", grid=2, constexprs={"T": "bf16", "W": 2},
                    inp=comm.register(x), out=out, sig=comm.signal, rank=comm.rank,
                    n_packs=PACKS, scale=1.0)
        staged = torch.zeros_like(x)
        comm.launch("allreduce_1stage", grid=2, constexprs={"T": "bf16", "W": 2},
                    inp=x, out=staged, sig=comm.signal, rank=comm.rank, n_packs=PACKS)
        table = torch.zeros_like(x)
        comm.launch("allreduce_1stage", grid=1, constexprs={"T": "bf16", "W": 2},
                    inp=comm.register(x.clone()), out=table, sig=comm.signal, rank=comm.rank,
                    n_packs=PACKS)
        return out, staged, table

    want = reference(2, 1.0).view(torch.int16)
    for outs in peerdsl.sim.run(2, fn, seed=7):
        for o in outs:
            assert torch.equal(o.view(torch.int16), want)


def test_peer_buffer_receives_what_peers_stored():
    def fn(comm):
        dst = comm.peer_buffer((comm.world, ROWS, H), torch.bfloat16)
        assert not dst.tensor.any()
        comm.launch(push_gather, grid=2, constexprs={"T": "bf16", "W": comm.world},
                    x=inputs(comm.rank), dst=dst, sig=comm.signal, rank=comm.rank,
                    n_packs=PACKS)
        return dst.tensor.clone()

    want = torch.stack([inputs(r) for r in range(3)])
    for got in peerdsl.sim.run(3, fn, seed=2, skew=25, comm_cls=_comm_cls(3)):
        assert torch.equal(got.view(torch.int16), want.view(torch.int16))


def test_two_registered_inputs_one_staged_the_other_registered():
    def fn(comm):
        a = torch.arange(64, dtype=torch.float32) + 100 * comm.rank
        b = torch.full((64,), 0.5 + comm.rank)
        out = torch.zeros(64)
        with pytest.raises(LaunchArgError, match=r"RegisteredPtrs \['a', 'b'\]: one tensor "
                           r"per launch is staged.*comm\.register"):
            comm.launch(two_registered, grid=1, constexprs={"W": 2}, a=a, b=b, out=out,
                        sig=comm.signal, rank=comm.rank, n=64)
        comm.launch(two_registered, grid=1, constexprs={"W": 2}, a=a, b=comm.register(b),
                    out=out, sig=comm.signal, rank=comm.rank, n=64)
        return out

    out0, out1 = peerdsl.sim.run(2, fn, seed=4)
    assert torch.equal(out0, torch.arange(64.0) + 100 + 1.5)
    assert torch.equal(out1, torch.arange(64.0) + 0.5)


def test_peer_buffer_tensors_stay_in_step_with_the_device():
    """What the user writes into a registered tensor between launches is what the next
    launch reads; a PeerBuffer's tensor passed for a Ptr is its device memory, so the
    rank's own writes and its peers' land in the same place."""
    def fn(comm):
        x = inputs(comm.rank)
        inp = comm.register(x)
        out = comm.peer_buffer((ROWS, H), torch.bfloat16)
        comm.launch(allreduce_scale, grid=2, constexprs={"T": "bf16", "W": 2}, inp=inp,
                    out=out.tensor, sig=comm.signal, rank=comm.rank, n_packs=PACKS, scale=1.0)
        first = out.tensor.clone()
        x.mul_(2)  # in place, on the host: the next launch reads it
        comm.launch(allreduce_scale, grid=2, constexprs={"T": "bf16", "W": 2}, inp=inp,
                    out=out, sig=comm.signal, rank=comm.rank, n_packs=PACKS, scale=0.25)
        return first, out.tensor

    for first, second in peerdsl.sim.run(2, fn, seed=9):
        assert torch.equal(first.view(torch.int16), reference(2, 1.0).view(torch.int16))
        assert torch.equal(second.view(torch.int16), reference(2, 0.5).view(torch.int16))

    def ring(comm):
        buf = comm.peer_buffer(4, torch.float32)
        comm.launch(ring_put, grid=1, constexprs={"W": 3}, mine=buf.tensor, dst=buf,
                    sig=comm.signal, rank=comm.rank)
        return buf.tensor

    for r, got in enumerate(peerdsl.sim.run(3, ring, seed=5, comm_cls=_comm_cls(3))):
        assert got.tolist() == [r + 1, 10 + (r - 1) % 3, 0, 0]


def test_kernel_without_peers_runs_on_each_rank_alone():
    """No rendezvous: rank 0 launches twice, rank 1 once; results land in the tensor passed."""
    def fn(comm):
        x = torch.arange(100, dtype=torch.float32)
        y = torch.full((100,), float(comm.rank))
        for _ in range(2 - comm.rank):
            comm.launch(local_axpy, grid=2, x=x, y=y, a=2.0, n=100)
        return y

    y0, y1 = peerdsl.sim.run(2, fn, seed=1)
    assert torch.equal(y0, 4 * torch.arange(100.0))
    assert torch.equal(y1, 2 * torch.arange(100.0) + 1)


# ---- bad arguments: each error names the argument, what it got and what is declared -------

def good_args(comm):
    return dict(inp=comm.register(inputs(0)), out=torch.zeros(ROWS, H, dtype=torch.bfloat16),
                sig=comm.signal, rank=comm.rank, n_packs=PACKS, scale=0.5)


def bf16_view_at(offset_bytes: int) -> torch.Tensor:
    return torch.zeros(ROWS * H + 8, dtype=torch.bfloat16)[offset_bytes // 2:][:ROWS * H]


@pytest.mark.parametrize("change, pattern", [
    ({"n_packs": 1.5}, r"'n_packs' got float 1\.5; the kernel declares i32"),
    ({"rank": True}, r"'rank' got bool True; the kernel declares i32.*pass int\(True\)"),
    ({"n_packs": 2**31}, r"'n_packs'.*out of range for i32"),
    ({"scale": "0.5"}, r"'scale' got str '0\.5'; the kernel declares f32"),
    ({"scale": 1e39}, r"'scale'.*overflows f32"),
    ({"n_packs": torch.tensor(3)}, r"'n_packs'.*tensor.*\.item\(\)"),
    ({"out": torch.zeros(ROWS, H, dtype=torch.float16)},
     r"'out' got a float16 tensor of shape \(8, 64\) on cpu; the kernel declares Ptr\[bf16\]"),
    ({"out": bf16_view_at(2)}, r"'out'.*not 16-byte aligned \(the kernel accesses 16-byte"),
    ({"out": torch.zeros(H, ROWS, dtype=torch.bfloat16).t()}, r"'out'.*not contiguous"),
    ({"out": torch.zeros(ROWS, H, dtype=torch.bfloat16, device="meta")},
     r"'out'.*on the simulator pass CPU tensors"),
    ({"out": [16, 32]}, r"'out'.*a list of addresses is for PeerPtrs"),
    ({"inp": inputs(0)}, r"'inp' got a bfloat16 tensor.*PeerPtrs\[bf16\].*comm\.register"),
    ({"inp": [16] * 9}, r"'inp'.*1\.\.8 addresses, got 9"),
    ({"sig": 4096}, r"'sig' got int 4096; the kernel declares PeerPtrs\[i32\]"),
])
def test_bad_argument_is_named(change, pattern):
    def fn(comm):
        args = good_args(comm)
        args.update(change)
        with pytest.raises(LaunchArgError, match=pattern):
            comm.launch(allreduce_scale, grid=1, constexprs={"T": "bf16", "W": 1}, **args)
        return True

    assert peerdsl.sim.run(1, fn) == [True]


def test_missing_unknown_dtype_of_a_peer_buffer_and_grid():
    def fn(comm):
        cx = {"T": "bf16", "W": 1}
        args = good_args(comm)
        with pytest.raises(LaunchArgError, match=r"missing arguments \['scale'\]; unknown "
                           r"arguments \['bogus'\] \(the kernel takes inp: PeerPtrs\[bf16\]"):
            comm.launch(allreduce_scale, grid=1, constexprs=cx, bogus=1,
                        **{k: v for k, v in args.items() if k != "scale"})
        f16 = comm.register(torch.zeros(ROWS, H, dtype=torch.float16))
        with pytest.raises(LaunchArgError, match=r"'inp' got PeerBuffer\(float16.*dtype "
                           r"float16 is not the declared element bf16"):
            comm.launch(allreduce_scale, grid=1, constexprs=cx, **dict(args, inp=f16))
        with pytest.raises(LaunchArgError, match=r"'n_packs'.*\n  argument 'scale'"):
            comm.launch(allreduce_scale, grid=1, constexprs=cx,
                        **dict(args, n_packs=1.0, scale=None))   # every problem at once
        with pytest.raises(LaunchArgError, match=r"grid 0 is not in \[1, 2\^31\)"):
            comm.launch(allreduce_scale, grid=0, constexprs=cx, **args)
        with pytest.raises(LaunchArgError, match=r"grid 257 exceeds 256.*synchronizes"):
            comm.launch(allreduce_scale, grid=257, constexprs=cx, **args)
        with pytest.raises(LaunchArgError, match=r"grid must be a positive int.*one-dim"):
            comm.launch(allreduce_scale, grid=(2, 2), constexprs=cx, **args)
        with pytest.raises(KeyError, match="no op 'nope' is registered"):
            comm.launch("nope", grid=1, **args)
        with pytest.raises(TypeError, match="launch_ir"):
            comm.launch(allreduce_scale.trace(T="bf16", W=1), grid=1, **args)
        with pytest.raises(Exception, match=r"constexprs missing \['W'\]"):
            comm.launch(allreduce_scale, grid=1, constexprs={"T": "bf16"}, **args)
        return True

    assert peerdsl.sim.run(1, fn) == [True]


def test_local_kernel_is_not_capped_but_checked():
    def fn(comm):
        x, y = torch.ones(300), torch.zeros(300)
        comm.launch(local_axpy, grid=5, x=x, y=y, a=1, n=300)  # 5 x 64 threads cover 300
        with pytest.raises(LaunchArgError, match=r"'x' got a float64 tensor.*Ptr\[f32\]"):
            comm.launch(local_axpy, grid=5, x=x.double(), y=y, a=1.0, n=300)
        return y

    assert torch.equal(peerdsl.sim.run(1, fn)[0], torch.ones(300))


@dsl.kernel(block_size=BLOCK)
def scale_packs(x: Ptr["T"], out: Ptr["T"], n_packs: dsl.i32, scale: dsl.f32, T: constexpr):
    P = dsl.vec16(T)
    for i in range(dsl.block_id() * BLOCK + dsl.thread_id(), n_packs, dsl.num_blocks() * BLOCK):
        out.cast(P)[i] = dsl.pack_rne([a * scale for a in x.cast(P)[i].to_f32()], T)


register("test_user_scale_packs", scale_packs, lambda target: [{"T": dsl.bf16}, {"T": dsl.f16}])


def test_dtype_no_registered_variant_takes_is_refused():
    """A float32 launch of an op registered for bf16/f16 only raises, naming T and what the
    variants take, before any rank runs it: no GPU build could hold it, and the kernel's
    16-byte packs of 8 elements would read float32 rows wrong. A registered dtype runs."""
    def fn(comm):
        x = torch.randn(PACKS * 8)  # float32
        with pytest.raises(TypeError, match=r"takes T in \['bf16', 'f16'\].*got f32"):
            comm.launch("test_user_scale_packs", grid=2, constexprs={"T": torch.float32},
                        x=x, out=torch.zeros_like(x), n_packs=PACKS, scale=2.0)
        y = x.to(torch.bfloat16)
        out = torch.zeros_like(y)  # bf16, registered: launched and exact
        comm.launch("test_user_scale_packs", grid=2, constexprs={"T": torch.bfloat16},
                    x=y, out=out, n_packs=PACKS, scale=2.0)
        assert torch.equal(out, y * 2)
        return True
    assert peerdsl.sim.run(2, fn, seed=3) == [True, True]
