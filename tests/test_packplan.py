"""The trusted launch path packs exactly the bytes the checked path does."""
import random
import struct

import pytest

from peerdsl.runtime.kernarg import KernargError, arg_specs_from_json, pack_args
from peerdsl.runtime.packplan import PackPlan


def layout():
    args, off = [], 0
    for i in range(8):
        args.append({"name": f"inp_{i}", "type": "ptr<bf16>", "offset": off, "size": 8})
        off += 8
    for name in ("out", "q"):
        args.append({"name": name, "type": "ptr<bf16>", "offset": off, "size": 8})
        off += 8
    for name, t in (("rank", "i32"), ("eps", "f32"), ("big", "i64")):
        off = (off + (8 if t == "i64" else 4) - 1) // (8 if t == "i64" else 4) * (
            8 if t == "i64" else 4)
        args.append({"name": name, "type": t, "offset": off, "size": 8 if t == "i64" else 4})
        off += 8 if t == "i64" else 4
    return arg_specs_from_json(args), (off + 7) // 8 * 8


@pytest.mark.parametrize("peers", [1, 2, 4, 8])
def test_same_bytes_as_the_checked_path(peers):
    specs, size = layout()
    rng = random.Random(peers)
    for _ in range(50):
        values = {"inp": [rng.randrange(1 << 47) * 16 for _ in range(peers)],
                  "out": rng.randrange(1 << 47) * 16, "q": None,
                  "rank": rng.randrange(-2**31, 2**31), "eps": rng.random(),
                  "big": rng.randrange(-2**63, 2**63)}
        assert PackPlan(specs, size).pack(values) == pack_args(specs, size, values)


def test_out_of_range_scalar_still_raises():
    specs, size = layout()
    values = {"inp": [16], "out": 16, "q": 0, "rank": 2**31, "eps": 0.0, "big": 0}
    with pytest.raises(Exception):
        PackPlan(specs, size).pack(values)


# ---- the compiled filler (PackPlan.fill), which the CUDA loader's trusted launch uses ----

class _Handle:
    """A driver handle (CUdeviceptr-like): converts with int(), has no __index__."""

    def __init__(self, v):
        self.v = v

    def __int__(self):
        return self.v


def shuffled_layout(rng):
    """Scalars of every width, a pointer, and two peer tables whose members sit out of order
    and interleaved with other arguments, each at a naturally aligned offset."""
    kinds = ([("p", "ptr<bf16x8>", 8), ("s8", "i8", 1), ("s16", "i16", 2), ("d", "f64", 8),
              ("f", "f32", 4), ("n", "i32", 4), ("big", "i64", 8)]
             + [(f"sig_{i}", "ptr<i32,global>", 8) for i in range(8)]
             + [(f"inp_{i}", "ptr<bf16>", 8) for i in range(4)])
    rng.shuffle(kinds)
    args, off = [], 0
    for name, t, size in kinds:
        off = (off + size - 1) // size * size + size * rng.randrange(2)  # sometimes a gap
        args.append({"name": name, "type": t, "offset": off, "size": size})
        off += size
    return arg_specs_from_json(args), (off + 7) // 8 * 8 + 8 * rng.randrange(2)


@pytest.mark.parametrize("seed", range(20))
def test_fill_matches_the_checked_path_on_any_layout(seed):
    rng = random.Random(seed)
    specs, size = shuffled_layout(rng)
    plan = PackPlan(specs, size)
    for _ in range(20):
        values = {"p": rng.randrange(1 << 44) * 16, "s8": rng.randrange(-128, 128),
                  "s16": rng.randrange(-2**15, 2**15), "d": rng.random() * 1e300,
                  "f": rng.random(), "n": rng.randrange(-2**31, 2**31),
                  "big": rng.randrange(-2**63, 2**63),
                  "sig": [rng.randrange(1 << 44) * 4 for _ in range(rng.randrange(1, 9))],
                  "inp": [rng.randrange(1 << 44) * 2 for _ in range(rng.randrange(1, 5))]}
        want = pack_args(specs, size, values)
        buf = bytearray(b"\xAB" * size)  # stale bytes: the fill must overwrite every one
        plan.fill(buf, values)
        assert bytes(buf) == want == plan.pack(values)


def test_fill_converts_tensors_none_and_handles_like_the_checked_path():
    torch = pytest.importorskip("torch")
    specs, size = layout()
    plan = PackPlan(specs, size)
    t = torch.zeros(64, dtype=torch.bfloat16)
    sub = torch.nn.Parameter(torch.zeros(8, dtype=torch.bfloat16))  # a Tensor subclass
    values = {"inp": [16, 32], "out": t, "q": sub, "rank": 3, "eps": 0.5, "big": -1}
    ints = dict(values, out=t.data_ptr(), q=sub.data_ptr())
    assert plan.pack(values) == pack_args(specs, size, ints)
    values = dict(ints, out=None, q=_Handle(4096))
    assert plan.pack(values) == pack_args(specs, size, dict(ints, out=0, q=4096))
    # a table entry that is not an int takes the per-field path: same bytes
    values = dict(ints, inp=[_Handle(16), None, t])
    assert plan.pack(values) == pack_args(specs, size, dict(ints, inp=[16, 0, t.data_ptr()]))


def test_fill_rejects_what_cannot_be_packed():
    specs, size = layout()
    plan = PackPlan(specs, size)
    good = {"inp": [16], "out": 16, "q": 0, "rank": 0, "eps": 0.0, "big": 0}
    buf = bytearray(size)
    for bad in ({"inp": [16] * 9}, {"inp": []}, {"rank": 2**31}, {"big": 2**63},
                {"eps": "x"}, {"out": -16}):
        with pytest.raises((struct.error, KernargError, IndexError)):
            plan.fill(buf, dict(good, **bad))
    with pytest.raises(KeyError):
        plan.fill(buf, {k: v for k, v in good.items() if k != "rank"})


def test_plan_names_cannot_inject_code():
    evil = 'x"]); import os; os.environ["PEERDSL_PWNED"] = "1"; (v["'
    specs = arg_specs_from_json([{"name": evil, "type": "i32", "offset": 0, "size": 4}])
    assert PackPlan(specs, 4).pack({evil: 7}) == b"\x07\0\0\0"
    import os
    assert "PEERDSL_PWNED" not in os.environ


def test_every_built_kernel_packs_the_same_bytes():
    """Opportunistic: the real layouts of a manifest built here (PEERDSL_BUILD_DIR or
    ./build, e.g. by benchmarks/host_cost.py), every kernel, random values."""
    import os

    from peerdsl.runtime.kernarg import _SCALARS
    from peerdsl.runtime.manifest import load_manifest
    root = os.environ.get("PEERDSL_BUILD_DIR", "build")
    archs = [a for a in ("sm_90", "gfx1250", "gfx950", "gfx942")
             if os.path.exists(os.path.join(root, a, "manifest.json"))]
    if not archs:
        pytest.skip(f"no built manifest under {root}")
    rng = random.Random(7)
    for arch in archs:
        for e in load_manifest(root, arch, verify=False).kernels.values():
            tables = e.peer_tables
            members = {m for ms in tables.values() for m in ms}
            for _ in range(5):
                values = {b: [rng.randrange(1 << 40) * 16 for _ in range(rng.randrange(
                    1, len(ms) + 1))] for b, ms in tables.items()}
                for a in e.args:
                    if a.name in members:
                        continue
                    _fmt, _size, lo, hi = _SCALARS.get(a.type.scalar, (None, 0, None, None))
                    values[a.name] = (rng.randrange(1 << 40) * 16 if a.type.is_pointer else
                                      rng.random() if lo is None else rng.randrange(lo, hi + 1))
                assert e.pack_plan().pack(values) == pack_args(e.args, e.kernarg_size, values)
