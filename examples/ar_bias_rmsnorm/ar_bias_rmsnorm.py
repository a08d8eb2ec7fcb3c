"""All-reduce + bias + residual + RMSNorm in one kernel: a new fused collective written only
with the public DSL (`import peerdsl
from peerdsl import dsl`). docs/TUTORIAL.md walks through it.

For every row, with T the tensor dtype (bf16 or f16), f32 arithmetic and round-to-nearest-even
wherever a value is rounded to T (SPEC section 2's style):

    a_j   = T(((f32(x_0j) + f32(x_1j)) + ...) + f32(x_{W-1}j))   all-reduce, rank order
    b_j   = T(f32(a_j) + f32(bias_j))                           + bias
    s_j   = f32(b_j) + f32(residual_j)                          + residual (kept in f32)
    residual_out_j = T(s_j)
    inv   = 1 / sqrt(sum_j s_j^2 / H + eps)                     dsl.block_sum's order
    out_j = T((s_j * inv) * f32(w_j))

The two intermediate roundings (a and b) are the ones the unfused chain makes: comm.all_reduce
returns T, `ar + bias` in torch rounds to T, and the shipped add + RMSNorm kernel takes it
from there. With the same thread mapping as that kernel (thread t of B owns the 16-byte packs
t, t + B, ... of the row, B = `threads_per_row`: 256, or what the target's `norm_threads`
sets for H) the fused op gives the unfused chain's bytes exactly.

One stage, one launch: Signal start (every rank's input of this call is staged), each block
takes rows b, b + G, ..., each thread reads its packs of the row straight from every rank's
registered input, and Signal end (no rank may overwrite its input while a peer still reads).
"""
from __future__ import annotations

import peerdsl
from peerdsl import dsl
from peerdsl.dsl import PeerPtrs, Ptr, RegisteredPtrs, constexpr

BLOCK = 256                    # threads per row where the target sets no other
PACK = 8                       # T elements in one 16-byte pack
HIDDEN = (2880, 4096, 6144, 8192)
WORLDS = (2, 4, 8)
DTYPES = (dsl.bf16, dsl.f16)


def threads_per_row(target, H: int) -> int:
    """B, the threads that share a row in the shipped norm kernels of `target` (the object
    `variants` is given) at hidden size H: the mapping to copy to give their bytes."""
    return dict(getattr(target, "norm_threads", ())).get(H, BLOCK)


def packs_per_thread(H: int) -> int:
    return -(-(H // PACK) // dsl.block_size())   # (block_size: the traced B, a Python int)


def pack_of(k: int):
    """Index, inside a row, of this thread's k-th pack."""
    return dsl.thread_id() + k * dsl.block_size()


def in_row(H: int, k: int):
    """Whether this thread's k-th pack lies inside the row (Python True when always)."""
    if (H // PACK) % dsl.block_size() == 0:
        return True
    return pack_of(k) < H // PACK


def load_packs(base, row, H: int, T) -> list:
    """This thread's packs of `row` of a [rows, H] T tensor, as lists of f32 (zeros past
    the end of the row). Row 0 of a [H] vector (bias, weight) is the vector."""
    vec = base.cast(dsl.vec16(T))
    out = []
    for k in range(packs_per_thread(H)):
        vals = [0.0] * PACK
        if in_row(H, k):
            vals = vec[row * (H // PACK) + pack_of(k)].to_f32()
        out.append(vals)
    return out


def store_packs(base, row, H: int, T, values: list) -> None:
    vec = base.cast(dsl.vec16(T))
    for k in range(packs_per_thread(H)):
        if in_row(H, k):
            vec[row * (H // PACK) + pack_of(k)] = dsl.pack_rne(values[k], T)


def biased_allreduce(inp, bias: list, row, H: int, T, W: int) -> list:
    """b = T(T(rank-order sum of every rank's packs) + bias), as f32, for this thread."""
    P = dsl.vec16(T)
    out = []
    for k in range(packs_per_thread(H)):
        vals = [0.0] * PACK
        if in_row(H, k):
            i = row * (H // PACK) + pack_of(k)
            acc = inp[0].cast(P)[i].to_f32()       # from x_0: rank order, on every rank
            for r in range(1, W):                  # constant bound: unrolled
                acc = [a + x for a, x in zip(acc, inp[r].cast(P)[i].to_f32())]
            vals = [(a.to(T).to_f32() + b).to(T).to_f32() for a, b in zip(acc, bias[k])]
        out.append(vals)
    return out


@dsl.kernel(block_size="B", min_blocks="M")
def ar_bias_rmsnorm(inp: RegisteredPtrs["T"], bias: Ptr["T"], residual: Ptr["T"],
                    weight: Ptr["T"], out: Ptr["T"], residual_out: Ptr["T"],
                    sig: PeerPtrs[dsl.i32], rank: dsl.i32, rows: dsl.i32, eps: dsl.f32,
                    call: dsl.CallId, T: constexpr, H: constexpr, W: constexpr,
                    B: constexpr = BLOCK, M: constexpr = 0):
    # bias and weight are this rank's own, the same for every row: their loads are issued
    # before the start barrier, so their latency hides behind it
    b = load_packs(bias, 0, H, T)
    w = load_packs(weight, 0, H, T)
    signal = dsl.Signal(sig, rank, W, call=call)
    signal.start()
    for row in range(dsl.block_id(), signal.bound(rows), dsl.num_blocks()):
        s = [[x + r for x, r in zip(pb, pr)]
             for pb, pr in zip(biased_allreduce(inp, b, row, H, T, W),
                               load_packs(residual, row, H, T))]
        store_packs(residual_out, row, H, T, s)
        sq = 0.0
        for k in range(packs_per_thread(H)):
            for v in s[k]:
                sq = sq + v * v
        inv = dsl.rsqrt(dsl.block_sum(sq) / float(H) + eps)   # 1 / sqrt, both rounded once
        store_packs(out, row, H, T, [[(v * inv) * wj for v, wj in zip(ps, pw)]
                                     for ps, pw in zip(s, w)])
    signal.end()


def min_blocks(B: int) -> int:
    """M, the blocks per SM the compiler must fit (0: its choice). Blocks that wait on
    peers' blocks need room for a second one on each SM: ranks sharing a GPU under MPS each
    launch about one per SM. Past 256 threads the register budget may leave room for one
    only (102 registers at W = 8, H = 2880, B = 384), so ask for 2, as the shipped kernels do."""
    return 2 if B > BLOCK else 0


def variants(target) -> list[dict]:
    """The specializations `peerdsl build --module` compiles for a target."""
    return [{"T": T, "H": H, "W": W, "B": threads_per_row(target, H),
             "M": min_blocks(threads_per_row(target, H))}
            for T in DTYPES for H in HIDDEN for W in WORLDS]


peerdsl.register_op("ar_bias_rmsnorm", ar_bias_rmsnorm, variants)
