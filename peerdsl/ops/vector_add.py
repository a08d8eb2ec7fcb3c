"""Example op: out = T(f32(a) + f32(b)) over 16-byte packs (bf16x8 / f16x8).

Small on purpose: `peerdsl build --ops vector_add` exercises the whole toolchain and the
runtime's loader on a kernel whose result is easy to check.
"""
from .. import dsl
from ..dsl import Ptr, constexpr
from .registry import register

BLOCK = 256


@dsl.kernel(block_size=BLOCK)
def vector_add(a: Ptr["T"], b: Ptr["T"], out: Ptr["T"], n_packs: dsl.i32, T: constexpr):
    """n_packs 16-byte packs of T; a grid-stride loop so any grid size covers them."""
    P = dsl.vec16(T)
    pa, pb, po = a.cast(P), b.cast(P), out.cast(P)
    for i in range(dsl.block_id() * BLOCK + dsl.thread_id(), n_packs, dsl.num_blocks() * BLOCK):
        xs = pa[i].to_f32()
        ys = pb[i].to_f32()
        po[i] = dsl.pack_rne([x + y for x, y in zip(xs, ys)], T)


def variants(target):
    return [{"T": T} for T in (dsl.bf16, dsl.f16)]


register("vector_add", vector_add, variants)
