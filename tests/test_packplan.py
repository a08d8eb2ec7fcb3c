"""The trusted launch path packs exactly the bytes the checked path does."""
import random

import pytest

from peerdsl.runtime.kernarg import PackPlan, arg_specs_from_json, pack_args


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
