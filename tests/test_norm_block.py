"""The norm kernels' thread mapping per target and hidden size (ops/_row_slots.py
`norm_block`, lowering/targets.py `norm_threads`): every norm-family kernel of a target is
built with the same B at one H, the runtime launches what is built, and on sm_90 at H = 2880
(384 threads, one pack each) and 7168 (224 threads, four packs each) every fused path still
gives the unfused bytes on every rank and meets SPEC section 2 against the float64
reference."""
from __future__ import annotations

import pytest
import torch

import peerdsl.sim
from peerdsl.lowering.targets import TARGETS, get_target
from peerdsl.ops._row_slots import NORM_BLOCK, norm_block
from peerdsl.ops.registry import load_all
from peerdsl.runtime.built import Built, from_registry
from reference import add_rmsnorm_f64, all_reduce_ref, quant_fp8_ref, ulp_diff

NORM_OPS = ("add_rmsnorm", "per_token_quant_fp8", "fused_ar_rms_1stage",
            "fused_ar_rms_1stage_rows", "fused_ar_rms_2stage", "fused_ar_rms_gather",
            "fused_ar_rms_ll")
NORM_PREFIXES = ("add_rmsnorm", "per_token_quant", "fused_ar_rms")


@pytest.mark.parametrize("arch", list(TARGETS))
def test_every_norm_kernel_is_built_with_the_targets_mapping(arch):
    target, ops = get_target(arch), load_all()
    for op in NORM_OPS:
        for v in ops[op].variants(target):
            assert v["B"] == norm_block(target, v["H"]), (arch, op, v)
        for v in ops[f"{op}_runtime_h"].variants(target) if f"{op}_runtime_h" in ops else ():
            assert v["B"] == NORM_BLOCK, (arch, op, v)
    expected = {2880: 384, 7168: 224} if arch == "sm_90" else {}
    assert {h: norm_block(target, h) for h in (2880, 4096, 6144, 7168, 8192)
            if norm_block(target, h) != NORM_BLOCK} == expected


def test_the_runtime_launches_the_built_mapping():
    built = from_registry("sm_90")
    assert built.row_kernel("add_rmsnorm", 2880).constexprs == {"H": 2880, "B": 384}
    assert built.row_kernel("fused_ar_rms_gather", 6144).constexprs == {"H": 6144, "B": 256}
    assert built.row_kernel("add_rmsnorm", 2880, True).constexprs == {"MAXH": 4096, "B": 256}
    old = Built("sm_90", "an older manifest", {"add_rmsnorm": ({"T": "bf16", "H": 2880},)}, "")
    assert old.row_kernel("add_rmsnorm", 2880).constexprs == {"H": 2880}  # matched as built
    mixed = Built("sm_90", "a mixed manifest", {"add_rmsnorm": (
        {"T": "bf16", "H": 2880, "B": 256}, {"T": "f16", "H": 2880, "B": 384})}, "rebuild")
    with pytest.raises(ValueError, match=r"several thread mappings \(add_rmsnorm B=\[256, 384\]"):
        mixed.row_kernel("add_rmsnorm", 2880)
    # one op rebuilt into an older manifest: add_rmsnorm at 384 threads, the fused kernel
    # still at 256 (no B named) would normalize differently: every norm op refuses the size
    partial = Built("sm_90", "a partly rebuilt manifest", {
        "add_rmsnorm": ({"T": "bf16", "H": 2880, "B": 384}, {"T": "bf16", "H": 6144, "B": 256}),
        "fused_ar_rms_1stage": ({"T": "bf16", "H": 2880, "W": 4}, {"T": "bf16", "H": 6144, "W": 4})},
        "rebuild")
    for op in ("add_rmsnorm", "fused_ar_rms_1stage"):
        with pytest.raises(ValueError, match=r"fused_ar_rms_1stage B=\[256\].*rebuild"):
            partial.row_kernel(op, 2880)
    assert partial.row_kernel("fused_ar_rms_1stage", 6144).constexprs == {"H": 6144}
    assert partial.row_kernel("add_rmsnorm", 6144).constexprs == {"H": 6144, "B": 256}


def _inputs(world, rows, hidden, dtype):
    g = torch.Generator().manual_seed(11)
    xs = [(torch.randn(rows, hidden, generator=g) * (r + 1)).to(dtype) for r in range(world)]
    residual = torch.randn(rows, hidden, generator=g).to(dtype)
    weight = (torch.rand(hidden, generator=g) + 0.5).to(dtype)
    for x in xs:  # an all-zero row: FP8 scale 0 and +0 bytes
        x[-1].zero_()
    residual[-1].zero_()
    return xs, residual, weight


def _run(monkeypatch, world, path, xs, residual, weight, opts, split=None):
    monkeypatch.setenv("PEERDSL_FUSED_PATH", path)
    if split is not None:
        monkeypatch.setenv("PEERDSL_FUSED_SPLIT", split)

    def body(comm):
        blocks, launch = [], comm._launch

        def recording(name, constexprs, *args, **kwargs):
            blocks.append((name, constexprs.get("B")))
            return launch(name, constexprs, *args, **kwargs)
        comm._launch = recording
        res = comm.fused_allreduce_rmsnorm(xs[comm.rank], residual, weight, **opts)
        return comm.last_path, blocks, [t.clone() for t in res if t is not None]

    results = peerdsl.sim.run(world, body, seed=2, skew=[0, 50, 0, 90][:world],
                              target="sm_90", spin_limit=4000)
    monkeypatch.delenv("PEERDSL_FUSED_SPLIT", raising=False)
    return results


@pytest.mark.parametrize("world,dt,opts,hidden", [
    (4, torch.bfloat16, {}, 2880), (4, torch.bfloat16, {"fp8_out": True, "bf16_mirror": True}, 2880),
    (2, torch.float16, {"gemma_norm": True}, 2880), (4, torch.bfloat16, {}, 7168)])
def test_sm90_mapped_sizes_every_path_gives_the_unfused_bytes(monkeypatch, world, dt, opts,
                                                               hidden):
    rows, threads = 5, {2880: 384, 7168: 224}[hidden]
    xs, residual, weight = _inputs(world, rows, hidden, dt)
    base = _run(monkeypatch, world, "unfused", xs, residual, weight, opts)
    runs = [("unfused", None), ("ll+rmsnorm", None), ("fused_1stage", None),
            ("fused_2stage", "0"), ("fused_2stage", "1")]
    for path, split in runs:
        got = _run(monkeypatch, world, path, xs, residual, weight, opts, split)
        for (ref_path, _, ref), (last, blocks, out) in zip(base, got):
            assert (ref_path, last) == ("unfused", path)
            # every norm kernel of the call ran the target's threads a row at this H
            norm = [b for name, b in blocks if name.startswith(NORM_PREFIXES)]
            assert norm and all(b == threads for b in norm), (path, blocks)
            for a, b in zip(ref, out):
                assert torch.equal(a.view(torch.uint8), b.view(torch.uint8)), (path, split)
    first = base[0][2]
    for _, _, other in base[1:]:
        assert all(torch.equal(a.view(torch.uint8), b.view(torch.uint8))
                   for a, b in zip(first, other))
    ar = all_reduce_ref(xs)
    out_ref, res_ref = add_rmsnorm_f64(ar, residual, weight,
                                       gemma_norm=opts.get("gemma_norm", False))
    assert torch.equal(first[1], res_ref)
    normed = first[3] if opts.get("fp8_out") else first[0]
    assert ulp_diff(normed, out_ref) <= 1
    if opts.get("fp8_out"):
        q_ref, s_ref = quant_fp8_ref(normed, "e4m3fn")
        assert torch.equal(first[0].view(torch.uint8), q_ref.view(torch.uint8))
        assert torch.equal(first[2], s_ref)
