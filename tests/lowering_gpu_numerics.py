"""The sm_90 code object vs the simulator, bit for bit, on edge-case inputs (a GPU check).

    python tests/lowering_gpu_numerics.py prepare DIR   # CPU: compile + simulate, write DIR
    python tests/lowering_gpu_numerics.py check DIR     # GPU (cupy): run the cubin, compare

Not a pytest module: the CPU machine has no GPU and the GPU machine has no MLIR. NaN results
compare as NaN (payload bits are not part of the contract); everything else bit for bit.
"""
from __future__ import annotations

import json
import os
import sys

import numpy as np

GRID, BLOCK = 8, 128
N = GRID * BLOCK
OUTS = {"of": (np.float32, 13), "ob": (np.uint16, 2), "oh": (np.uint16, 1), "oq": (np.int8, 4),
        "oi": (np.int32, 8), "osum": (np.float32, 3 * GRID / N)}


def inputs(seed: int = 5) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    raw = rng.integers(0, 2**32, N, dtype=np.uint64).astype(np.uint32).view(np.float32)
    special = np.array([0.0, -0.0, np.inf, -np.inf, np.nan, 1e-45, -1e-45, 1.17e-38, 3.4e38,
                        -3.4e38, 1.0, -1.0, 448.0, 464.0, 240.0, 0.0019, 2.0 ** -10,
                        2.0 ** -9 * 1.0625], np.float32)
    x = np.where(rng.random(N) < 0.5, raw, (rng.standard_normal(N) * 10.0 ** rng.integers(
        -8, 8, N)).astype(np.float32))
    x[:len(special)] = special
    y = (rng.standard_normal(N) * 10.0 ** rng.integers(-3, 3, N)).astype(np.float32)
    y[:4] = [0.0, -0.0, np.inf, 1e-40]
    z = rng.standard_normal(N).astype(np.float32)
    a = rng.integers(-2**31, 2**31, N, dtype=np.int64).astype(np.int32)
    b = rng.integers(-40, 40, N).astype(np.int32)
    a[:4] = [-2**31, 7, -7, 100]
    b[:4] = [-1, 0, 2, 33]
    return {"x": x, "y": y, "z": z, "a": a, "b": b}


def prepare(out: str) -> None:
    import torch

    import peerdsl.sim
    from peerdsl.lowering import pipeline
    sys.path.insert(0, os.path.dirname(__file__))
    from lowering_kernels import numerics

    os.makedirs(out, exist_ok=True)
    kern = numerics.trace()
    c = pipeline.compile_kernel(kern, "sm_90", "numerics")
    with open(os.path.join(out, "numerics.cubin"), "wb") as f:
        f.write(c.binary)
    ins = inputs()

    def body(comm):
        bufs = {k: comm.to_device(torch.from_numpy(v.copy())) for k, v in ins.items()}
        outs = {k: comm.to_device(torch.zeros(int(N * n), dtype=_torch(dt)))
                for k, (dt, n) in OUTS.items()}
        comm.launch_local(numerics, {}, GRID, {**bufs, **outs})
        return {k: comm.to_torch(b).numpy().copy() for k, b in outs.items()}

    want = peerdsl.sim.run(1, body, target="sm_90")[0] if _sim_takes_target() else \
        peerdsl.sim.run(1, body)[0]
    np.savez(os.path.join(out, "numerics.npz"), **ins, **{f"want_{k}": v for k, v in want.items()})
    with open(os.path.join(out, "numerics.json"), "w") as f:
        json.dump({"args": c.args, "symbol": c.symbol, "resources": c.resources}, f)
    print(f"prepared {out}: {c.resources}")
    prepare_probe(out)


def prepare_probe(out: str) -> None:
    """barrier_probe for W=2, for `check`: two ranks as two concurrent streams."""
    from peerdsl import layout
    from peerdsl.ops.barrier_probe import barrier_probe
    from peerdsl.lowering import pipeline
    c = pipeline.compile_kernel(barrier_probe.trace(W=2), "sm_90", "barrier_probe_w2")
    with open(os.path.join(out, "probe.cubin"), "wb") as f:
        f.write(c.binary)
    with open(os.path.join(out, "probe.json"), "w") as f:
        json.dump({"args": c.args, "symbol": c.symbol, "signal_bytes": layout.SIGNAL_BYTES,
                   "spin_limit_word": layout.SIG_SPIN_LIMIT, "error_word": layout.SIG_ERROR}, f)


def _sim_takes_target() -> bool:
    import inspect

    import peerdsl.sim
    return "target" in inspect.signature(peerdsl.sim.run).parameters


def _torch(dt):
    import torch
    return {np.float32: torch.float32, np.uint16: torch.int16, np.int8: torch.int8,
            np.int32: torch.int32}[dt]


def check(out: str) -> int:
    import cupy as cp
    d = np.load(os.path.join(out, "numerics.npz"))
    meta = json.load(open(os.path.join(out, "numerics.json")))
    mod = cp.RawModule(path=os.path.join(out, "numerics.cubin"))
    fn = mod.get_function(meta["symbol"])
    dev = {k: cp.asarray(d[k]) for k in ("x", "y", "z", "a", "b")}
    for k, (dt, n) in OUTS.items():
        dev[k] = cp.zeros(int(N * n), dtype=dt if dt is not np.uint16 else np.int16)
    args = tuple(dev[a["name"]] for a in meta["args"])
    fn((GRID,), (BLOCK,), args)
    cp.cuda.runtime.deviceSynchronize()
    bad = 0
    for k in OUTS:
        got, want = cp.asnumpy(dev[k]), d[f"want_{k}"]
        if got.dtype == np.float32:
            same = (got.view(np.uint32) == want.view(np.uint32)) | (np.isnan(got) & np.isnan(want))
        elif k in ("ob", "oh"):
            g, w = got.view(np.uint16), want.view(np.uint16)
            exp, man = (0x7F80, 0x7F) if k == "ob" else (0x7C00, 0x3FF)
            nan = lambda v: ((v & exp) == exp) & ((v & man) != 0)  # noqa: E731
            same = (g == w) | (nan(g) & nan(w))
        else:
            same = got == want
        idx = np.nonzero(~same)[0]
        bad += len(idx)
        print(f"{k}: {len(idx)} of {same.size} differ")
        for j in idx[:8]:
            print(f"   [{j}] got {got[j]!r} want {want[j]!r}")
    print("numerics: PASS" if bad == 0 else f"numerics: FAIL: {bad} values differ")
    if os.path.exists(os.path.join(out, "probe.json")):
        bad += check_probe(out)
    return 0 if bad == 0 else 1


def check_probe(out: str, world: int = 2, grid: int = 4, rounds: int = 5) -> int:
    """Rank r = a launch on its own stream; all ranks' launches of a round run concurrently."""
    import cupy as cp
    meta = json.load(open(os.path.join(out, "probe.json")))
    fn = cp.RawModule(path=os.path.join(out, "probe.cubin")).get_function(meta["symbol"])
    words = meta["signal_bytes"] // 4
    sigs = [cp.zeros(words, np.int32) for _ in range(world)]
    for s in sigs:
        s[meta["spin_limit_word"]] = 1 << 26
    slots = [cp.zeros(grid, np.int32) for _ in range(world)]
    outs = [cp.zeros(2 * grid, np.int32) for _ in range(world)]
    counter = cp.zeros(1, np.int32)
    streams = [cp.cuda.Stream(non_blocking=True) for _ in range(world)]
    null = cp.zeros(1, np.int32)
    bad = 0
    for rnd in range(1, rounds + 1):
        for r in range(world):
            vals = {"counter": counter, "out": outs[r], "rank": np.int32(r),
                    "counter_target": np.int32(rnd * world * grid), "stamp": np.int32(rnd)}
            for i in range(8):
                vals[f"sig_{i}"] = sigs[i] if i < world else null
                vals[f"slots_{i}"] = slots[i] if i < world else null
            with streams[r]:
                fn((grid,), (64,), tuple(vals[a["name"]] for a in meta["args"]))
        cp.cuda.runtime.deviceSynchronize()
        for r in range(world):
            o = cp.asnumpy(outs[r]).reshape(grid, 2)
            err = cp.asnumpy(sigs[r][meta["error_word"]:meta["error_word"] + 6])
            ok = (o[:, 0] == 1).all() and (o[:, 1] == world).all() and err[0] == 0
            bad += 0 if ok else 1
            print(f"probe round {rnd} rank {r}: ok={o[:, 0].tolist()} seen={o[:, 1].tolist()} "
                  f"error={err.tolist()} {'PASS' if ok else 'FAIL'}")
    # negative control: rank 1 never launches; rank 0's spins must expire and record it
    sigs[0][meta["spin_limit_word"]] = 1 << 14
    vals = {"counter": counter, "out": outs[0], "rank": np.int32(0),
            "counter_target": np.int32((rounds + 1) * world * grid), "stamp": np.int32(99)}
    for i in range(8):
        vals[f"sig_{i}"] = sigs[i] if i < world else null
        vals[f"slots_{i}"] = slots[i] if i < world else null
    fn((grid,), (64,), tuple(vals[a["name"]] for a in meta["args"]))
    cp.cuda.runtime.deviceSynchronize()
    o = cp.asnumpy(outs[0]).reshape(grid, 2)
    err = cp.asnumpy(sigs[0][meta["error_word"]:meta["error_word"] + 6])
    ok = (o[:, 0] == 0).all() and err[0] == 1
    print(f"probe negative control (rank 1 absent): ok={o[:, 0].tolist()} error={err.tolist()} "
          f"{'PASS (timed out and recorded)' if ok else 'FAIL'}")
    return bad + (0 if ok else 1)


if __name__ == "__main__":
    mode, path = sys.argv[1], sys.argv[2]
    sys.exit(prepare(path) if mode == "prepare" else check(path))
