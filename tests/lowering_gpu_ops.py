"""Real single-GPU ops: the sm_90 cubin vs the simulator, byte for byte (a GPU check).

    python tests/lowering_gpu_ops.py prepare DIR   # CPU: compile + simulate, write DIR
    python tests/lowering_gpu_ops.py check DIR     # GPU (cupy): run the cubins, compare

add_rmsnorm (plain, gemma, FP8 + bf16 mirror, gemma + FP8) and per_token_quant_fp8, bf16 and
fp16, H=6144 and 2880, 7 rows over a grid of 3 blocks (so the grid-stride loop runs). The
last row is all zeros (FP8 scale 0, +0 bytes).
"""
from __future__ import annotations

import json
import os
import sys

import numpy as np

ROWS, GRID = 7, 3
NP = {"bf16": np.uint16, "f16": np.uint16, "f32": np.float32, "i8": np.int8, "i32": np.int32}


def cases():
    import peerdsl.dsl as dsl
    from peerdsl.ops.add_rmsnorm import add_rmsnorm
    from peerdsl.ops.quant_fp8 import per_token_quant_fp8
    out = []
    for T, H in ((dsl.bf16, 6144), (dsl.f16, 2880)):
        for flags in (0, 1, 2 | 4, 3):
            out.append((f"add_rmsnorm_{T}_{H}_f{flags}", add_rmsnorm,
                        {"T": T, "H": H, "FP8": "e4m3fn"},
                        {"rows": ROWS, "eps": 1e-6, "flags": flags}))
        out.append((f"quant_{T}_{H}", per_token_quant_fp8, {"T": T, "H": H, "FP8": "e4m3fn"},
                    {"rows": ROWS}))
    return out


def _buffers(kern, H: int, rng) -> dict[str, np.ndarray]:
    """Inputs filled with data, outputs with a poison pattern (so unwritten bytes show)."""
    import torch
    bufs = {}
    for p in kern.params:
        if not hasattr(p.type, "elem"):
            continue
        e = p.type.elem.name
        n = H if p.name == "weight" else ROWS if p.name == "scale" else ROWS * H
        if p.name in ("x", "residual", "weight"):
            t = torch.from_numpy(rng.standard_normal(n).astype(np.float32))
            t = t * (3.0 if p.name != "weight" else 0.5) + (1.0 if p.name == "weight" else 0.0)
            t = t.to(torch.bfloat16 if e == "bf16" else torch.float16)
            if p.name != "weight":
                t[(ROWS - 1) * H:] = 0
            bufs[p.name] = t.view(torch.int16).numpy().view(np.uint16).copy()
        else:
            bufs[p.name] = np.full(n * np.dtype(NP[e]).itemsize, 0x5A, np.uint8).view(NP[e])
    return bufs


def prepare(out: str) -> None:
    import torch

    import peerdsl.sim
    from peerdsl.lowering import pipeline
    os.makedirs(out, exist_ok=True)
    rng = np.random.default_rng(11)
    index = []
    for name, k, cx, scalars in cases():
        kern = k.trace(**cx)
        c = pipeline.compile_kernel(kern, "sm_90", name)
        with open(os.path.join(out, f"{name}.cubin"), "wb") as f:
            f.write(c.binary)
        bufs = _buffers(kern, cx["H"], rng)

        def body(comm, bufs=bufs, k=k, cx=cx, scalars=scalars):
            dev = {n: comm.to_device(torch.from_numpy(v.view(np.uint8).copy())) for n, v in
                   bufs.items()}
            comm.launch_local(k, cx, GRID, {**dev, **scalars})
            return {n: comm.to_torch(b).numpy().copy() for n, b in dev.items()}

        want = peerdsl.sim.run(1, body, target="sm_90")[0]
        np.savez(os.path.join(out, f"{name}.npz"), **{f"in_{n}": v for n, v in bufs.items()},
                 **{f"want_{n}": v for n, v in want.items()})
        index.append({"name": name, "symbol": c.symbol, "args": c.args, "scalars": scalars})
        written = sum(int((want[n].view(np.uint8) != bufs[n].view(np.uint8)).sum()) for n in bufs)
        print(f"prepared {name}: the simulator wrote {written} bytes", flush=True)
    with open(os.path.join(out, "index.json"), "w") as f:
        json.dump(index, f)


def check(out: str) -> int:
    import cupy as cp
    index = json.load(open(os.path.join(out, "index.json")))
    bad = 0
    for case in index:
        d = np.load(os.path.join(out, f"{case['name']}.npz"))
        fn = cp.RawModule(path=os.path.join(out, f"{case['name']}.cubin")).get_function(
            case["symbol"])
        dev = {k[3:]: cp.asarray(d[k].view(np.uint8)) for k in d.files if k.startswith("in_")}
        args = []
        for a in case["args"]:
            if a["type"].startswith("ptr"):
                args.append(dev[a["name"]])
            else:
                v = case["scalars"][a["name"]]
                args.append(np.float32(v) if a["type"] == "f32" else np.int32(v))
        fn((GRID,), (256,), tuple(args))
        cp.cuda.runtime.deviceSynchronize()
        diffs = []
        for n in dev:
            got, want = cp.asnumpy(dev[n]), d[f"want_{n}"].view(np.uint8)
            nd = int((got != want).sum())
            if nd:
                diffs.append(f"{n}: {nd} bytes differ (first at {int(np.argmax(got != want))})")
        bad += bool(diffs)
        print(f"{case['name']}: {'PASS' if not diffs else 'FAIL ' + '; '.join(diffs)}")
    print("ops: PASS" if not bad else f"ops: FAIL ({bad} cases)")
    return 1 if bad else 0


if __name__ == "__main__":
    mode, path = sys.argv[1], sys.argv[2]
    sys.exit(prepare(path) if mode == "prepare" else check(path))
