"""Row helpers shared by every kernel that normalizes or quantizes a row (SPEC section 2).

The fused kernels and the unfused add + RMSNorm kernel must produce the same bytes, so they
share these helpers *and* the thread mapping (ops/_row_slots.py: which packs a thread owns,
for a constexpr or a run-time hidden size H), and every sum of squares goes through
dsl.block_sum in that order.

Non-finite rows follow torch's unfused steps (tests/reference.py): NaN and inf propagate as
there, and FP8 bytes and scales of such rows are torch's byte for byte. Rows whose f32 sum of
squares overflows are recomputed with power-of-two scaling. Both are block-uniform branches
taken only by such rows, so every other row keeps its code, registers and bytes.
"""
from __future__ import annotations

from typing import Any, Callable

from .. import dsl
from ..dsl.lib import FP8_NAN, i8_const
# the geometry, re-exported: the ops and the runtime import it from here
from ._row_slots import (HIDDEN_MAX, HIDDEN_MIN, NORM_BLOCK, PACK,  # noqa: F401
                         PREDICATED_PER_THREAD, RUNTIME_MAXH, SUPPORTED_HIDDEN, Hidden,
                         RuntimeHidden, collective_min_blocks, hidden_f32,
                         hidden_rule_error, norm_block, norm_min_blocks, norm_threads,
                         one_stage_predicated_slots, pack_index, pack_valid,
                         predicates_reads, row_geometry, runtime_class, slot_pack)

FLAG_GEMMA = 1       # runtime flags of the norm kernels
FLAG_FP8 = 2
FLAG_MIRROR = 4
INF = float("inf")
FP8_MAX_BYTE = {"e4m3fn": 0x7E, "e4m3fnuz": 0x7F}  # the byte of +FP8_MAX


def load_row_packs(base: Any, row: Any, H: Hidden, T: Any) -> list:
    """This thread's packs of row `row` as f32 lists (zeros past the end of the row)."""
    packs, per_thread = row_geometry(H)
    vec = base.cast(dsl.vec16(T))
    out = []
    for k in range(per_thread):
        if predicates_reads(H):
            vals = slot_pack(vec, row * packs + pack_index(k), H, k).to_f32()
        else:
            vals = [0.0] * PACK
            if pack_valid(H, k):
                vals = vec[row * packs + pack_index(k)].to_f32()
        out.append(vals)
    return out


def quant_row_fp8(out_f32: "list | Callable[[int], list]", row: Any, H: Hidden, q: Any,
                  scale: Any, fmt: str) -> None:
    """Per-token FP8 of one row (SPEC 2.4): out_f32 holds f32 of the T-rounded outputs, as a
    list of this thread's packs or as `out_f32(k)` giving pack k (called once for the amax
    and once for the codes, so nothing of the row need stay in registers between them).

    The standalone quant kernel and the fused epilogue both call this. A NaN anywhere in the
    row makes amax NaN (as torch's amax does) and an inf makes it inf; such a row is then
    corrected by `_fix_nonfinite_row`, after the common path, so that path keeps its code and
    its registers and pays one block-uniform compare and branch per row.
    """
    packs, per_thread = row_geometry(H)
    pack_of = out_f32 if callable(out_f32) else out_f32.__getitem__
    amax = 0.0
    for k in range(per_thread):
        if pack_valid(H, k):  # a pack past the row is zeros: it adds nothing to the max
            for v in pack_of(k):
                amax = dsl.fmaximum(amax, dsl.abs(v))
    amax = dsl.block_max(amax)
    s = amax * (1.0 / dsl.FP8_MAX[fmt])  # constant in double, rounded once to f32
    inv = 0.0 if s == 0.0 else dsl.rcp(s)
    qvec = q.cast(dsl.i8x8)
    for k in range(per_thread):
        if pack_valid(H, k):
            # A zero output is the +0 byte: SPEC's all-zero-row rule, applied per element so
            # neither -0 nor 0 * inf (a subnormal scale has an infinite reciprocal) leaks out.
            # A NaN product (only in a row of NaN or inf) gives FP8_MAX's byte here (to_fp8's
            # clamp is maxNum/minNum); _fix_nonfinite_row relies on exactly that.
            # One element's conversion at a time (schedule_fence): else the scheduler runs
            # a pack's 8 together, ~5 registers each (gfx1250 VGPRs, lowering/targets.py).
            codes = []
            for v in pack_of(k):
                codes.append(0 if v == 0.0 else dsl.to_fp8(v * inv, fmt, finite=True))
                dsl.schedule_fence()
            qvec[row * packs + pack_index(k)] = dsl.pack(codes, dsl.i8)
    if dsl.thread_id() == 0:
        scale[row] = s
    if not (s < INF):  # block-uniform (s has the same bits on every thread): NaN or inf
        _fix_nonfinite_row(row, H, qvec, scale, s, fmt)


def _byte(b: int) -> Any:
    """The byte b (0..255) as a traced i8."""
    return dsl.as_scalar(i8_const(b), dsl.i8)


def _fix_nonfinite_row(row: Any, H: Hidden, qvec: Any, scale: Any, s: Any, fmt: str) -> None:
    """Rewrite a row holding a NaN or an inf to what torch's unfused steps give
    (tests/reference.py `quant_fp8_ref`), byte for byte. The common path has written
    0 for zeros and to_fp8(v * inv) otherwise, with inv = rcp(s):
      NaN in the row: amax NaN (torch's amax gives the NaN 0x7FC00000), so scale NaN and
        inv NaN; every nonzero v gave the FP8_MAX byte; torch gives the NaN byte
        (e4m3fn 0x7F, e4m3fnuz 0x80).
      else an inf: scale +inf and inv = 1/inf = 0, so a finite v gave to_fp8(v * 0) = the
        signed zero torch gives too (e4m3fn 0x80 for v < 0; e4m3fnuz has no -0), and an inf
        gave the FP8_MAX byte for inf * 0 = NaN; torch's CPU NaN there is x86's default NaN,
        negative: e4m3fn 0xFF, e4m3fnuz 0x80.
    So: FP8_MAX's byte becomes the NaN byte, and a NaN scale the NaN torch gives. Each thread
    rereads the packs it has just written (its own stores: program order)."""
    packs, per_thread = row_geometry(H)
    nan_row = s != s
    max_byte = _byte(FP8_MAX_BYTE[fmt])
    nan_byte = dsl.select(nan_row, _byte(FP8_NAN[fmt]),
                          _byte(0xFF if fmt == "e4m3fn" else 0x80))
    for k in range(per_thread):
        if pack_valid(H, k):
            i = row * packs + pack_index(k)
            qvec[i] = dsl.pack([dsl.select(b == max_byte, nan_byte, b)
                                for b in qvec[i].elements()], dsl.i8)
    if dsl.thread_id() == 0:
        scale[row] = dsl.select(nan_row, float("nan"), s)


def sum_squares(s: list) -> Any:
    """This thread's f32 sum of squares of its packs, in pack then element order."""
    acc = 0.0
    for pack in s:
        for v in pack:
            acc = acc + v * v
    return acc


def overflow_safe_inv(s: list, H: Hidden, eps: Any) -> Any:
    """rsqrt(mean(s^2) + eps) for a row whose f32 sum of squares overflowed, by power-of-two
    scaling: p = 2^(127 - e) for the row's largest |s_j| = m with biased exponent e brings m
    into [1, 2) ([2, 4) in the top binade, where p = 2^-126), so no square overflows.
    Scaling by a power of two commutes with every rounding (a value small enough to
    underflow has a square far below one ulp of the sum, and so has eps p^2), so
    rsqrt(sum (s p)^2 / H + eps p^2) * p is what f32 with an unbounded exponent would give;
    the final * p is exact unless inv is below 2^-126 (an RMS above 2^126), where it is
    subnormal and keeps 22 of its 24 bits. An inf in the row (m = inf) keeps the sum inf
    and inv 0, the unscaled path's (and torch's) result.
    Contains barriers: call it under a block-uniform condition only."""
    m = 0.0
    for pack in s:
        for v in pack:
            m = dsl.fmaximum(m, dsl.abs(v))
    m = dsl.block_max(m)
    e = (m.bitcast(dsl.i32) >> 23) & 0xFF
    p = (dsl.maximum(254 - e, 1) << 23).bitcast(dsl.f32)
    total = dsl.block_sum(sum_squares([[v * p for v in pack] for pack in s]))
    return dsl.rsqrt(total / hidden_f32(H) + (eps * p) * p) * p


def normed_pack(s_k: list, weight: Any, k: int, T: Any, inv: Any, w_add: Any,
                w: "list | None" = None) -> list:
    """(s * inv) * (w + w_add) for this thread's k-th pack, as f32 (w_add: 1 with gemma, else
    -0.0); `w` the weight pack when it was read already, else it is read here."""
    if w is None:
        w = base_packs(weight, T)[pack_index(k)].to_f32()
    return [(v * inv) * (wj + w_add) for v, wj in zip(s_k, w)]


def weight_packs(weight: Any, H: Hidden, T: Any) -> list:
    """This thread's weight packs of the row (f32; zeros past the row)."""
    _, per_thread = row_geometry(H)
    vec = base_packs(weight, T)
    out = []
    for k in range(per_thread):
        if predicates_reads(H):
            w = slot_pack(vec, pack_index(k), H, k).to_f32()
        else:
            w = [0.0] * PACK
            if pack_valid(H, k):
                w = vec[pack_index(k)].to_f32()
        out.append(w)
    return out


def rmsnorm_epilogue(s: list, row: Any, H: Hidden, T: Any, weight: Any, eps: Any, flags: Any,
                     out: Any, q: Any, scale: Any, fmt: str, ahead: int = 1) -> None:
    """Given s = f32(ar) + f32(residual) for this thread's packs, write out (and FP8).

    `ahead` as in residual_norm_row. When it covers the whole row the weight packs are
    read before the block reduction, so their latency hides behind its barriers. Otherwise
    each output pack is computed from s and its weight pack when it is written (again for
    the FP8 codes: the same operations give the same bits), so beside s only one pack is
    in registers at a time."""
    packs, per_thread = row_geometry(H)
    whole_row = ahead == 0 or ahead >= per_thread
    w = weight_packs(weight, H, T) if whole_row else [None] * per_thread
    total = dsl.block_sum(sum_squares(s))
    inv = dsl.rsqrt(total / hidden_f32(H) + eps)
    # Block-uniform (the sum has the same bits on every thread), so the barriers inside are
    # reached by all threads or none. Finite squares overflowed, or the row holds an inf;
    # a NaN makes the sum NaN and the outputs NaN on the common path, as torch's.
    if total == INF:
        inv = overflow_safe_inv(s, H, eps)
    # -0.0 gives every w back exactly (-0.0 too): one add of a uniform value, where a select
    # of w + 1 and w held both in registers
    w_add = dsl.select((flags & FLAG_GEMMA) != 0, 1.0, -0.0)
    fp8 = (flags & FLAG_FP8) != 0
    if _carries_out_packs(H):
        # out in T once per pack, for its store and for the FP8 codes (SPEC 2.4 quantizes
        # the T-rounded out: its T bits are all the codes need)
        outs = [_out_pack(s[k], weight, H, k, T, inv, w_add, w[k]) for k in range(per_thread)]
        out_pack = outs.__getitem__
        out_f32 = lambda k: outs[k].to_f32()  # noqa: E731
    else:
        out_pack = lambda k: dsl.pack_rne(normed_pack(s[k], weight, k, T, inv, w_add, w[k]),  # noqa: E731
                                          T)
        out_f32 = lambda k: [v.to(T).to_f32()  # noqa: E731
                             for v in normed_pack(s[k], weight, k, T, inv, w_add, w[k])]
    if (not fp8) or ((flags & FLAG_MIRROR) != 0):
        vec = base_packs(out, T)
        for k in range(per_thread):
            if pack_valid(H, k):
                vec[row * packs + pack_index(k)] = out_pack(k)
    if fp8:
        quant_row_fp8(out_f32, row, H, q, scale, fmt)


def _carries_out_packs(H: Hidden) -> bool:
    """Whether rmsnorm_epilogue computes each out pack once and keeps it for the FP8 codes
    (else the codes recompute it from s, reading the weight pack again). A constexpr H
    whose row ends inside a block's last slot (2880, 7168) tests every pack's slot, so each
    pack's codes sit in a branch of their own and are computed one pack at a time: there
    keeping the out packs (16 x 8 at W=2, H=2880) holds fewer registers than keeping s * inv,
    which LLVM shares between the passes (gfx1250: 48 -> 34 VGPRs at H=2880, 64 -> 50 at
    7168). Where the packs are straight-line code nothing orders one pack's codes after
    another's, and LLVM interleaves the whole row's (4096: 51 -> 58, 8192: 63 -> 78); the
    weight reads between the passes' stores keep them one pack at a time."""
    return isinstance(H, int) and (H // PACK) % norm_threads() != 0


def _out_pack(s_k: list, weight: Any, H: Hidden, k: int, T: Any, inv: Any, w_add: Any,
              w: "list | None") -> Any:
    """T(normed_pack) of this thread's k-th pack; a slot past the row reads no weight (its
    pack is never stored nor quantized) and holds zeros."""
    valid = pack_valid(H, k)
    if w is not None or valid is True:
        return dsl.pack_rne(normed_pack(s_k, weight, k, T, inv, w_add, w), T)
    o = dsl.pack([0.0] * PACK, T)
    if valid:
        o = dsl.pack_rne(normed_pack(s_k, weight, k, T, inv, w_add), T)
    return o


def residual_norm_row(ar_pack: Callable[[int], list], row: Any, H: Hidden, T: Any, residual: Any,
                      residual_out: Any, weight: Any, eps: Any, flags: Any, out: Any, q: Any,
                      scale: Any, fmt: str, ahead: int = 1) -> None:
    """Given `ar_pack(k)`, which reads this thread's k-th all-reduced pack of the row (f32 of
    T values) at its index pack_index(k): add the residual, write residual_out, and run the
    RMSNorm epilogue. Every norm kernel ends a row here. ar_pack is called only for packs
    inside the row, except where H predicates its reads (predicates_reads): then for every
    slot, and it reads through `slot_pack`, so a slot past the row gives +0.

    `ahead` (a kernel constexpr, per target: lowering/targets.py `row_reads_ahead`) is how
    many packs are read before their residual_out stores: the store may alias the inputs,
    so no compiler hoists a later pack's loads above it. 1 reads, adds and stores one pack
    at a time (one pack's inputs, W peers' packs in the fused kernels, in registers at
    once); k > 1 reads k packs at a time and 0 the whole row, so their loads are in flight
    together (more registers, far less waiting where each block has few warps). The
    values, and so the bytes, are the same either way."""
    packs, per_thread = row_geometry(H)
    res = base_packs(residual, T)
    group = per_thread if ahead == 0 else ahead
    s = []
    for first in range(0, per_thread, group):
        ks = list(range(first, min(first + group, per_thread)))
        read = [_added_pack(ar_pack, res, row, H, k) for k in ks]
        for k, vals in zip(ks, read):
            _store_pack(residual_out, row, H, T, k, vals)
            s.append(vals)
    rmsnorm_epilogue(s, row, H, T, weight, eps, flags, out, q, scale, fmt, ahead)


def _added_pack(ar_pack: Callable[[int], list], res: Any, row: Any, H: Hidden, k: int) -> list:
    """f32(ar) + f32(residual) of this thread's k-th pack of the row: zeros past the row,
    read under `if` or, where H predicates its reads, through slot_pack."""
    packs, _ = row_geometry(H)
    if predicates_reads(H):
        # +0 past the row (slot_pack) in both, so in their sum; the residual read first (the
        # other order spilled 8 bytes in the fused one-stage kernel at MAXH 8192, W = 8)
        res_k = slot_pack(res, row * packs + pack_index(k), H, k).to_f32()
        return [a + b for a, b in zip(ar_pack(k), res_k)]
    vals = [0.0] * PACK
    if pack_valid(H, k):
        i = row * packs + pack_index(k)
        vals = [a + b for a, b in zip(ar_pack(k), res[i].to_f32())]
    return vals


def _store_pack(dst: Any, row: Any, H: Hidden, T: Any, k: int, vals: list) -> None:
    """dst's k-th pack of the row = T(vals), for a pack inside the row."""
    packs, _ = row_geometry(H)
    if pack_valid(H, k):
        dst.cast(dsl.vec16(T))[row * packs + pack_index(k)] = dsl.pack_rne(vals, T)


def residual_norm_rows(ar_pack: Callable[[Any, int], list], rows: list, valid: list, H: Hidden,
                       T: Any, residual: Any, residual_out: Any, weight: Any, eps: Any,
                       flags: Any, out: Any, q: Any, scale: Any, fmt: str) -> None:
    """residual_norm_row for several rows of one block at once: `ar_pack(row, k)` reads a
    row's k-th all-reduced pack; every pack of every row is read before the first store, so
    a block with few warps has V rows' loads in flight. `valid[v]` (block-uniform) says
    whether row v is to be written; a row that is not is read (its index must be in range)
    but stores nothing. Each row's values, sum of squares and stores are those of
    residual_norm_row, so the bytes are the same."""
    _, per_thread = row_geometry(H)
    res = base_packs(residual, T)
    # (a lambda per row, called at once: the tracer rewrites nested defs' calls)
    sums = [[_added_pack(lambda k: ar_pack(row, k), res, row, H, k) for k in range(per_thread)]
            for row in rows]
    for row, ok, s in zip(rows, valid, sums):
        if ok:
            for k in range(per_thread):
                _store_pack(residual_out, row, H, T, k, s[k])
    for row, ok, s in zip(rows, valid, sums):
        if ok:
            rmsnorm_epilogue(s, row, H, T, weight, eps, flags, out, q, scale, fmt, 0)


def residual_norm_block_rows(ar_pack: Callable[[Any, int], list], n: Any, V: int, H: Hidden,
                             T: Any, residual: Any, residual_out: Any, weight: Any, eps: Any,
                             flags: Any, out: Any, q: Any, scale: Any, fmt: str,
                             ahead: int = 1) -> None:
    """This block's rows b, b + G, ... < n (G blocks) through residual_norm_row (`ahead` as
    there), or for a constexpr V > 1 V rows per iteration through residual_norm_rows, all
    their packs read before the first store. `ar_pack(row, k)` reads a row's k-th
    all-reduced pack. Rows past the end reread the iteration's first row (in range) and
    store nothing, so the bytes stored are those of V = 1."""
    if V == 1:
        for row in range(dsl.block_id(), n, dsl.num_blocks()):
            # (a lambda, not a nested def: the tracer rewrites nested defs' calls)
            residual_norm_row(lambda k: ar_pack(row, k), row, H, T, residual, residual_out,
                              weight, eps, flags, out, q, scale, fmt, ahead)
        return
    stride = dsl.num_blocks()
    for row in range(dsl.block_id(), n, stride * V):
        block_rows = [row] + [dsl.select(row + v * stride < n, row + v * stride, row)
                              for v in range(1, V)]
        valid = [True] + [row + v * stride < n for v in range(1, V)]
        residual_norm_rows(ar_pack, block_rows, valid, H, T, residual, residual_out, weight,
                           eps, flags, out, q, scale, fmt)


def row_pack_reader(base: Any, row: Any, H: Hidden, T: Any) -> Callable[[int], list]:
    """`ar_pack` for residual_norm_row: this thread's k-th pack of row `row` of `base`."""
    packs, _ = row_geometry(H)
    vec = base_packs(base, T)
    return lambda k: slot_pack(vec, row * packs + pack_index(k), H, k).to_f32()


def base_packs(base: Any, T: Any) -> Any:
    return base.cast(dsl.vec16(T))
