"""Small DSL kernels that together use every DSL feature, for the lowering tests."""
from __future__ import annotations

import peerdsl.dsl as dsl
from peerdsl.dsl import PeerPtrs, Ptr, constexpr


def scale_and_clamp(x, k):
    """A helper with traced control flow inside (rewritten on first use)."""
    y = x * k
    if y > 100.0:
        y = 100.0 + 0.0 * y
    return y


@dsl.kernel(block_size=128)
def features(a: Ptr[dsl.f32], bv: Ptr["T"], out: Ptr[dsl.f32], q: Ptr[dsl.i8],
             ints: Ptr[dsl.i32], t64: Ptr[dsl.i64], n: dsl.i32, eps: dsl.f32, T: constexpr,
             FP8: constexpr):
    tid = dsl.thread_id()
    i = dsl.block_id() * dsl.block_size() + tid
    acc = 0.0
    for k in range(4):                              # static: unrolled
        acc = acc + a[i * 4 + k]
    for j in range(tid, n, dsl.block_size()):       # dynamic: scf.for
        acc = dsl.fma(a[j], 0.5, acc)
    m = 0
    while m * m < n:                                # scf.while
        m = m + 1
    if acc > eps:                                   # scf.if with results
        r = dsl.rsqrt(acc + eps)
        w = dsl.rcp(acc)
    else:
        r = dsl.sqrt(dsl.abs(acc))
        w = -acc
    r = scale_and_clamp(r, 3.0)
    # packs: bf16x8 / f16x8 loads, f32x4 build, truncf RNE back to T
    pk = bv.cast(dsl.vec16(T))[i]
    xs = pk.to_f32()
    s = xs[0] * xs[1] + xs[2]                        # mul then add: must not contract
    s = dsl.maximum(s, dsl.minimum(xs[3], w))
    bv.cast(dsl.vec16(T))[i] = dsl.pack_rne([x * r for x in xs], T)
    bv[i * 8 + 3] = dsl.maximum(pk[0], dsl.minimum(pk[1], pk[2]))  # max/min on bf16 / f16
    out.cast(dsl.f32x4)[i] = dsl.pack([s, r, w, acc], dsl.f32)
    # block reductions (smem + barrier + shfl_xor inside)
    total = dsl.block_sum(s)
    big = dsl.block_max(dsl.abs(s))
    sm = dsl.shared_array("tile", dsl.f32, 128)
    sm[tid] = total
    dsl.barrier()
    nb = sm[(tid + 1) % 128]
    lane = dsl.shfl_xor(nb, 16, 32) + dsl.shfl_xor(nb, 1, 16)
    q[i] = dsl.to_fp8(lane * big, FP8)
    # integer ops and casts
    x = ints[i]
    y = (x // 3) + (x % 5) - (x >> 2) + (x << 1) + (-x) + (~x & 7) + (x | 1) + (x ^ 5)
    y = dsl.maximum(y, dsl.minimum(x, 9)) + dsl.abs(x)
    z = y.to_f32().to_i32() + (x > 3).to_i32() + lane.bitcast(dsl.i32)
    ints[i] = dsl.select(x == 0, z, y)
    t64[i] = dsl.globaltimer() + z.to_i64() * 2
    if tid == 0:
        hp = bv.cast(dsl.vec16(T))[0].to_f32()
        bv.cast(dsl.vec16(T))[1] = dsl.pack_rne(hp, T)


@dsl.kernel(block_size=64)
def memory_ops(p: Ptr[dsl.i32], f: Ptr[dsl.f32], v: Ptr[dsl.bf16], p64: Ptr[dsl.i64],
               out: Ptr[dsl.i32]):
    t = dsl.thread_id()
    acc = dsl.load(p + t) + dsl.load(p + t, nontemporal=True)
    for scope in ("wave", "workgroup", "agent", "system"):
        for order in ("relaxed", "acquire"):
            acc = acc + dsl.load(p + 1, scope, order)
        for order in ("relaxed", "release"):
            dsl.store(p + 2, acc, scope, order)
        for order in ("relaxed", "acquire", "release", "acq_rel"):
            acc = acc + dsl.atomic_add(p + 3, 1, scope, order)
            if order != "relaxed":
                dsl.fence(scope, order)
        acc = acc + dsl.atomic_max(p + 4, acc, scope) + dsl.atomic_xchg(p + 5, acc, scope)
        acc = acc + dsl.atomic("umax", p + 6, acc, scope)
        acc = acc + dsl.atomic_cas(p + 7, 0, acc, scope, "acq_rel")
        acc = acc + dsl.atomic_cas(p + 7, 1, acc, scope, "relaxed")
        acc = acc + dsl.atomic_add(f + 1, 1.0, scope, "relaxed").to_i32()
        acc = acc + dsl.atomic_add(p64, 1, scope).to_i32()
    vp = v.cast(dsl.bf16x8)
    pk = dsl.load(vp + t, "system", "relaxed")             # scoped vector: volatile 16 B
    dsl.store(vp + t + 64, pk, "system", "relaxed")
    dsl.store(vp + t + 128, pk, nontemporal=True)
    dsl.store(p + 8, acc, "system", "release", nontemporal=True)
    sm = dsl.shared_array("flags", dsl.i32, 64)
    dsl.store(sm + t, acc, "workgroup", "release")
    dsl.barrier()
    acc = acc + dsl.load(sm + (63 - t), "workgroup", "acquire")
    acc = acc + dsl.atomic_add(sm, 1, "wave", "relaxed")
    out[t] = acc


@dsl.kernel(block_size=64)
def peers(sig: PeerPtrs[dsl.i32], data: PeerPtrs["T"], out: Ptr["T"], rank: dsl.i32,
          W: constexpr, T: constexpr):
    s = dsl.Signal(sig, rank, W)
    s.start()
    t = dsl.thread_id()
    acc = 0.0
    for r in range(W):                                     # constant peer index
        acc = acc + data[r][t].to_f32()
    other = data[(rank + 1) % W]                           # dynamic peer index
    acc = acc + other[t].to_f32()
    s.sync()
    out[t] = acc.to(T)
    s.end()


@dsl.kernel(block_size=64)
def mul_add(a: Ptr[dsl.f32], b: Ptr[dsl.f32], c: Ptr[dsl.f32], out: Ptr[dsl.f32]):
    """out = a * b + c: two roundings, never one fma."""
    t = dsl.thread_id()
    out[t] = a[t] * b[t] + c[t]


@dsl.kernel(block_size=32)
def control_edges(p: Ptr[dsl.i32], n: dsl.i64):
    """Loops and branches that carry no values (a bare spin, a store loop, an if)."""
    while dsl.load(p, "system", "acquire") == 0:
        pass
    for i in range(dsl.thread_id().to_i64(), n, 32):   # an i64 loop
        dsl.store(p + i, 1, "agent", "relaxed")
    if dsl.thread_id() == 0:
        dsl.store(p + 2, 3)
    else:
        dsl.fence("workgroup", "release")


ALL = {
    "features": (features, {"T": dsl.bf16, "FP8": "e4m3fn"}),
    "features_f16": (features, {"T": dsl.f16, "FP8": "e4m3fnuz"}),
    "memory_ops": (memory_ops, {}),
    "peers": (peers, {"W": 4, "T": dsl.bf16}),
    "mul_add": (mul_add, {}),
    "control_edges": (control_edges, {}),
}


@dsl.kernel(block_size=128)
def numerics(x: Ptr[dsl.f32], y: Ptr[dsl.f32], z: Ptr[dsl.f32], a: Ptr[dsl.i32],
             b: Ptr[dsl.i32], of: Ptr[dsl.f32], ob: Ptr[dsl.bf16], oh: Ptr[dsl.f16],
             oq: Ptr[dsl.i8], oi: Ptr[dsl.i32], osum: Ptr[dsl.f32]):
    """Every arithmetic op on edge-case inputs: compared bit for bit with the simulator on a
    GPU (tests/lowering_gpu_numerics.py)."""
    i = dsl.block_id() * dsl.block_size() + dsl.thread_id()
    xv, yv, zv, av, bv = x[i], y[i], z[i], a[i], b[i]
    f = of + i * 13
    f[0] = xv * yv + zv
    f[1] = dsl.rsqrt(xv)
    f[2] = dsl.rcp(yv)
    f[3] = dsl.sqrt(xv)
    f[4] = dsl.fma(xv, yv, zv)
    f[5] = xv / yv
    f[6] = dsl.maximum(xv, yv)
    f[7] = dsl.minimum(xv, zv)
    f[8] = dsl.abs(xv) - (-yv)
    f[9] = av.to_f32()
    f[10] = (xv - zv) * (yv + zv)
    f[11] = xv * 0.5
    f[12] = dsl.fmaximum(xv, yv)
    ob[i * 2] = xv.to_bf16()
    ob[i * 2 + 1] = (xv * yv).to_bf16()
    oh[i] = xv.to_f16()
    oq[i * 4] = dsl.to_fp8(xv * yv, "e4m3fn")
    oq[i * 4 + 1] = dsl.to_fp8(xv * yv, "e4m3fnuz")
    oq[i * 4 + 2] = dsl.to_fp8(xv * yv, "e4m3fn", finite=True)
    oq[i * 4 + 3] = dsl.to_fp8(xv * yv, "e4m3fnuz", finite=True)
    n = oi + i * 8
    n[0] = av // bv
    n[1] = av % bv
    n[2] = av >> bv
    n[3] = av << bv
    n[4] = dsl.minimum(dsl.maximum(zv * 1000.0, -1.0e9), 1.0e9).to_i32()
    n[5] = dsl.maximum(av, bv)
    n[6] = dsl.minimum(av, bv) + (av > bv).to_i32()
    n[7] = xv.bitcast(dsl.i32) ^ av
    s = dsl.block_sum(zv)
    m = dsl.block_max(dsl.abs(yv))
    mx = dsl.block_max(xv)  # NaN in the blocks whose x holds one
    if dsl.thread_id() == 0:
        osum[dsl.block_id() * 3] = s
        osum[dsl.block_id() * 3 + 1] = m
        osum[dsl.block_id() * 3 + 2] = mx
