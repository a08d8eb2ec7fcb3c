"""PackPlan, the one packing implementation: its trusted and checked paths write the bytes a
layout defines (checked here against an oracle that writes each field at its offset), for
manifest layouts and for foreign ones (`from_layout`, e.g. a reference cubin's)."""
import random
import struct

import pytest

from peerdsl.runtime.kernarg import KernargError, arg_specs_from_json, peer_tables
from peerdsl.runtime.packplan import PackPlan, pack_args

_FMT = {"i8": "<b", "i16": "<h", "i32": "<i", "i64": "<q", "f32": "<f", "f64": "<d"}


def oracle(specs, size, values):
    """Each argument packed alone at its offset; a table's missing entries are its first."""
    member = {m: (b, i) for b, ms in peer_tables(specs).items() for i, m in enumerate(ms)}
    buf = bytearray(size)
    for a in specs:
        if a.name in member:
            base, i = member[a.name]
            table = values[base]
            v = table[i] if i < len(table) else table[0]
        else:
            v = values[a.name]
        if a.type.is_pointer:
            v = 0 if v is None else v.data_ptr() if hasattr(v, "data_ptr") else int(v)
            struct.pack_into("<Q", buf, a.offset, v)
        else:
            struct.pack_into(_FMT[a.type.scalar], buf, a.offset, v)
    return bytes(buf)


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
def test_trusted_and_checked_paths_write_the_layouts_bytes(peers):
    specs, size = layout()
    rng = random.Random(peers)
    for _ in range(50):
        values = {"inp": [rng.randrange(1 << 47) * 16 for _ in range(peers)],
                  "out": rng.randrange(1 << 47) * 16, "q": None,
                  "rank": rng.randrange(-2**31, 2**31), "eps": rng.random(),
                  "big": rng.randrange(-2**63, 2**63)}
        plan = PackPlan(specs, size)
        assert plan.pack(values) == plan.pack_checked(values) == oracle(specs, size, values)
        assert pack_args(specs, size, values) == plan.pack(values)


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
def test_fill_matches_the_oracle_on_any_layout(seed):
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
        want = oracle(specs, size, values)
        buf = bytearray(b"\xAB" * size)  # stale bytes: the fill must overwrite every one
        plan.fill(buf, values)
        assert bytes(buf) == want == plan.pack(values) == plan.pack_checked(values)


def test_fill_converts_tensors_none_and_handles():
    torch = pytest.importorskip("torch")
    specs, size = layout()
    plan = PackPlan(specs, size)
    t = torch.zeros(64, dtype=torch.bfloat16)
    sub = torch.nn.Parameter(torch.zeros(8, dtype=torch.bfloat16))  # a Tensor subclass
    values = {"inp": [16, 32], "out": t, "q": sub, "rank": 3, "eps": 0.5, "big": -1}
    ints = dict(values, out=t.data_ptr(), q=sub.data_ptr())
    assert plan.pack(values) == oracle(specs, size, ints) == plan.pack_checked(ints)
    values = dict(ints, out=None, q=_Handle(4096))
    assert plan.pack(values) == oracle(specs, size, dict(ints, out=0, q=4096))
    # a table entry that is not an int takes the per-field path: same bytes
    values = dict(ints, inp=[_Handle(16), None, t])
    assert plan.pack(values) == oracle(specs, size, dict(ints, inp=[16, 0, t.data_ptr()]))


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
                want = oracle(e.args, e.kernarg_size, values)
                assert e.pack_plan().pack(values) == e.pack(values) == want


# ---- the checked path -----------------------------------------------------------------------

def test_checked_path_names_what_is_wrong():
    specs, size = layout()
    plan = PackPlan(specs, size, "my_kernel")
    good = {"inp": [16], "out": 16, "q": 0, "rank": 0, "eps": 0.0, "big": 0}
    for bad, pattern in [({"rank": 1.5}, r"'rank': i32 needs an int"),
                         ({"big": 2**63}, r"'big': .* out of range for i64"),
                         ({"eps": 1e39}, r"'eps': .* overflows f32"),
                         ({"out": 17}, r"'out': address 0x11 is not 2-byte aligned"),
                         ({"inp": [16] * 9}, r"peer table 'inp' takes 1..8 entries, got 9"),
                         ({"inp": 16}, r"'inp' is the peer table inp_0..inp_7: pass a list"),
                         ({"x": 1}, r"my_kernel: missing arguments \[\], unknown arguments "
                                    r"\['x'\]")]:
        with pytest.raises(KernargError, match=pattern):
            plan.pack_checked(dict(good, **bad))
    members = dict(good, **{f"inp_{i}": 16 * (i + 1) for i in range(8)})
    del members["inp"]
    assert plan.pack_checked(members) == plan.pack(dict(good, inp=[16 * (i + 1)
                                                                   for i in range(8)]))
    assert plan.unpack(plan.pack(good))["inp_7"] == 16


# ---- layouts that are not a manifest's (a HIP/CUDA reference kernel's) ---------------------

def test_foreign_layout_with_a_struct_of_peer_pointers_and_raw_bytes():
    """What compare's reference side packs: (name, offset, size, kind) read from a cubin."""
    plan = PackPlan.from_layout([("peers", 0, 64, "ptrs"), ("out", 64, 8, "ptr<bf16>"),
                                 ("rank", 72, 4, "i32"), ("eps", 76, 4, "f32"),
                                 ("blob", 80, 12, "bytes"), ("n", 96, 8, "i64")],
                                kernel="ref_kernel")
    assert plan.size == 104 and plan.names == ["peers", "out", "rank", "eps", "blob", "n"]
    values = {"peers": [0x1000, 0x2000], "out": 0x3000, "rank": 1, "eps": 0.5,
              "blob": b"abcdefghijkl", "n": -7}
    want = (struct.pack("<8Q", 0x1000, 0x2000, *[0x1000] * 6)
            + struct.pack("<Qif", 0x3000, 1, 0.5) + b"abcdefghijkl" + b"\0" * 4
            + struct.pack("<q", -7))
    assert plan.pack(values) == plan.pack_checked(values) == want
    with pytest.raises(KernargError, match=r"'blob' takes 12 raw bytes, got bytes of 3"):
        plan.pack_checked(dict(values, blob=b"abc"))
    with pytest.raises(KernargError, match=r"'out': address 0x3001 is not 2-byte aligned"):
        plan.pack_checked(dict(values, out=0x3001))
    # a total size past the last field pads with zeros; fields are checked for consistency
    assert PackPlan.from_layout([("x", 0, 4, "i32")], size=16).pack({"x": 3}) == \
        struct.pack("<i", 3) + bytes(12)
    for fields, pattern in [([("x", 0, 8, "i32")], "'x' is 8 bytes but a i32 takes 4"),
                            ([("t", 0, 12, "ptrs")], "not a multiple of 8"),
                            ([("a", 0, 8, "ptr"), ("b", 4, 4, "i32")], "'a' and 'b' overlap"),
                            ([("x", 0, 4, "u32")], "unknown argument type")]:
        with pytest.raises(KernargError, match=pattern):
            PackPlan.from_layout(fields)
    with pytest.raises(KernargError, match="past the 4-byte buffer"):
        PackPlan.from_layout([("x", 0, 8, "i64")], size=4)
