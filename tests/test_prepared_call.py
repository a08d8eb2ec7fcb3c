"""Prepared calls (issue 15 item 3): `comm.prepare_fused_allreduce_rmsnorm` and
`comm.prepare_all_reduce`.

On the simulator (for real, every path): results exact against the reference under skew at
TP2/TP4, bitwise equal to the plain call of the same arguments, interleaved with plain calls
and with prepared calls of other sizes; ranks may mix prepared and plain calls; one sequence
number per call; refused once broken or closed.

On the GPU Communicator, on the CPU (the real Communicator, CudaLoader and packing against
the CUDA fake, over a manifest of the shipped kernels traced here): each call patches the
call tag in bytes packed once and makes exactly one driver call, with the bytes the plain
call would send; no torch operation per call; launch failures and recorded errors break
the communicator; close() refuses; a foreign current context is recovered from.
"""
from __future__ import annotations

import importlib
import json
import os
import struct
import sys
import types

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

import torch.distributed as REAL_DIST  # before the GPU tests' fake replaces it

import peerdsl.sim
from cuda_fakes import CUresult, FakeDriver, Handle
from peerdsl import layout
from peerdsl.lowering.cache import jsonable
from peerdsl.runtime.callid import SEQ_MULT, code_of, tag_of
from peerdsl.runtime.errors import (CollectiveError, CommunicatorBroken, CommunicatorClosed)
from reference import add_rmsnorm_f64, all_reduce_ref, ulp_diff

H = 2880
BF16 = torch.bfloat16


def same(a: torch.Tensor, b: torch.Tensor) -> bool:
    return a.shape == b.shape and a.dtype == b.dtype and torch.equal(
        a.contiguous().view(torch.uint8), b.contiguous().view(torch.uint8))


def inputs(step: int, rank: int, rows: int, hidden: int = H):
    g = torch.Generator().manual_seed(1000 * step + 17 * rows + rank)
    return (torch.randn(rows, hidden, generator=g).to(BF16),
            torch.randn(rows, hidden, generator=g).to(BF16),
            (torch.rand(hidden, generator=g) + 0.5).to(BF16))


def fused_ok(got, step: int, tp: int, rank: int, rows: int) -> bool:
    """residual_out bitwise and out within 1 ulp of the float64 reference (SPEC section 2)."""
    xs = [inputs(step, r, rows)[0] for r in range(tp)]
    _, residual, weight = inputs(step, rank, rows)
    ref_out, ref_res = add_rmsnorm_f64(all_reduce_ref(xs), residual, weight)
    out, res_out = got
    return same(res_out, ref_res) and out.shape == ref_out.shape and ulp_diff(out, ref_out) <= 1


def skew(i: int) -> list[int]:
    """A different start delay per rank and launch (scheduler steps)."""
    return [(i * 37 + r * 53) % 160 for r in range(8)]


# ---------------------------------------------------------------------------- simulator
@pytest.mark.parametrize("tp,path", [(2, "fused_1stage"), (2, "ll+rmsnorm"),
                                     (4, "fused_1stage"), (4, "fused_2stage"),
                                     (4, "ll+rmsnorm")])
def test_prepared_fused_is_exact_under_skew_and_equals_the_plain_call(monkeypatch, tp, path):
    monkeypatch.setenv("PEERDSL_FUSED_PATH", path)
    rows = 5

    def body(comm):
        x, residual, weight = (t.clone() for t in inputs(0, comm.rank, rows))
        prep = comm.prepare_fused_allreduce_rmsnorm(x, residual, weight)
        report = [prep.path, prep.launches]
        for step in range(3):
            for t, new in zip((x, residual, weight), inputs(step, comm.rank, rows)):
                t.copy_(new)                      # the bound tensors, written in place
            seq = comm._seq
            got = prep()
            report.append(comm._seq - seq)        # one sequence number per call
            assert got is prep.result             # the same result tensors every call
            first = [t.clone() for t in got]
            plain = comm.fused_allreduce_rmsnorm(x, residual, weight)
            report.append(fused_ok(first, step, tp, comm.rank, rows))
            report.append(all(same(a, b) for a, b in zip(first, plain)))
        return report

    for rep in peerdsl.sim.run(tp, body, seed=3, skew=skew):
        launches = 2 if path == "ll+rmsnorm" else 1
        assert rep == [path, launches] + [1, True, True] * 3, rep


def test_prepared_calls_of_several_sizes_interleave_with_plain_calls(monkeypatch):
    """Prepared objects of different sizes, paths and options (fp8, gemma, staged input, an
    all-reduce) called in an irregular order with plain calls of other sizes in between."""
    monkeypatch.setenv("PEERDSL_LL_MAX_BYTES", "16384")  # 1 row LL, 3 and 6 rows one-stage
    tp = 4
    order = [0, 1, 2, 3, 1, 0, 3, 2, 2, 1]

    def body(comm):
        preps, bound = [], []
        for rows, kw in ((1, {}), (6, {"gemma_norm": True}), (3, {"stage_input": True})):
            x, residual, weight = (t.clone() for t in inputs(0, comm.rank, rows))
            preps.append(comm.prepare_fused_allreduce_rmsnorm(x, residual, weight, **kw))
            bound.append((x, residual, weight, rows, kw))
        a = torch.zeros(12288, dtype=BF16)        # 24 KiB: two-stage at TP4 with that cap
        out = torch.full_like(a, 7)
        ar = comm.prepare_all_reduce(a, out=out)
        report = [p.path for p in preps] + [ar.path, ar.result is out]
        for step, i in enumerate(order):
            if i == 3:
                a.copy_(torch.randn(12288, generator=torch.Generator().manual_seed(
                    step * 10 + comm.rank)).to(BF16))
                got = ar().clone()
                xs = comm.exchange(a.clone())
                report.append(same(got, all_reduce_ref(xs)))
            else:
                x, residual, weight, rows, kw = bound[i]
                for t, new in zip((x, residual, weight), inputs(step, comm.rank, rows)):
                    t.copy_(new)
                got = [t.clone() for t in preps[i]()]
                gemma = kw.get("gemma_norm", False)
                xs = comm.exchange(x.clone())
                ref_out, ref_res = add_rmsnorm_f64(all_reduce_ref(xs), residual, weight,
                                                   gemma_norm=gemma)
                report.append(same(got[1], ref_res) and ulp_diff(got[0], ref_out) <= 1)
            # a plain call of another size between prepared ones
            px, pres, pw = inputs(100 + step, comm.rank, 2)
            plain = comm.fused_allreduce_rmsnorm(px, pres, pw)
            pref = add_rmsnorm_f64(all_reduce_ref(comm.exchange(px)), pres, pw)
            report.append(same(plain[1], pref[1]))
        return report

    for rep in peerdsl.sim.run(tp, body, seed=5, skew=skew):
        assert rep[:5] == ["ll+rmsnorm", "fused_1stage", "fused_1stage", "2stage", True], rep
        assert rep[5:] == [True] * 2 * len(order), rep


def test_prepared_fp8_outputs_equal_the_plain_call(monkeypatch):
    monkeypatch.setenv("PEERDSL_FUSED_PATH", "fused_1stage")

    def body(comm):
        x, residual, weight = inputs(0, comm.rank, 4)
        prep = comm.prepare_fused_allreduce_rmsnorm(x, residual, weight, fp8_out=True,
                                                    bf16_mirror=True)
        got = [t.clone() for t in prep()]
        plain = comm.fused_allreduce_rmsnorm(x, residual, weight, fp8_out=True,
                                             bf16_mirror=True)
        return prep.result._fields, [same(a, b) for a, b in zip(got, plain)]

    for fields, equal in peerdsl.sim.run(2, body, seed=2):
        assert fields == ("q", "residual_out", "scale", "mirror") and equal == [True] * 4


@pytest.mark.parametrize("tp,env,path", [(2, {}, "ll"),
                                         (2, {"PEERDSL_LL_MAX_BYTES": "0"}, "1stage"),
                                         (4, {"PEERDSL_LL_MAX_BYTES": "0"}, "2stage")])
@pytest.mark.parametrize("stage_input", [False, True])
def test_prepared_all_reduce_paths(monkeypatch, tp, env, path, stage_input):
    for k, v in env.items():
        monkeypatch.setenv(k, v)

    def body(comm):
        x = torch.zeros(4, 512, dtype=BF16)
        prep = comm.prepare_all_reduce(x, stage_input=stage_input)
        ok = []
        for step in range(2):
            x.copy_(inputs(step, comm.rank, 4, 512)[0])
            got = prep().clone()
            ok.append(same(got, all_reduce_ref(comm.exchange(x.clone()))))
            ok.append(same(got, comm.all_reduce(x)))
        return prep.path, ok

    for got_path, ok in peerdsl.sim.run(tp, body, seed=7, skew=skew):
        assert got_path == path and ok == [True] * 4


def test_ranks_may_mix_staged_prepared_and_plain_calls(monkeypatch):
    """A prepared call that stages its input (as plain calls do) is the plain call of the
    same arguments: the same sequence numbers, tags and kernels, so one rank may make it
    prepared while its peers make it plain."""
    monkeypatch.setenv("PEERDSL_FUSED_PATH", "fused_1stage")
    rows = 3

    def body(comm):
        x, residual, weight = (t.clone() for t in inputs(0, comm.rank, rows))
        prep = comm.prepare_fused_allreduce_rmsnorm(x, residual, weight, eps=1e-6,
                                                    stage_input=True)
        ok = []
        for step in range(4):
            for t, new in zip((x, residual, weight), inputs(step, comm.rank, rows)):
                t.copy_(new)
            if (comm.rank + step) % 2:
                got = [t.clone() for t in prep()]
            else:
                got = comm.fused_allreduce_rmsnorm(x, residual, weight, eps=1e-6)
            ok.append(fused_ok(got, step, 2, comm.rank, rows))
        seq, tag, key = comm._call_log.recent[-1]
        return ok, key

    (ok0, key0), (ok1, key1) = peerdsl.sim.run(2, body, seed=4, skew=skew)
    assert ok0 == ok1 == [True] * 4 and key0 == key1


@pytest.mark.parametrize("other", ["the plain call", "another prepared call"])
def test_an_in_place_prepared_call_met_by_another_call_is_a_mismatch(monkeypatch, other):
    """Read in place, the input peers read is the prepared call's bound tensor: a peer
    making the plain call (it reads the pool) or another prepared call at that point must
    not pass for it. Its tag names the prepared call, so the ranks raise collective errors
    (a mismatch, or the abort mark of the peer that saw one) instead of returning a result
    computed from the wrong memory."""
    monkeypatch.setenv("PEERDSL_FUSED_PATH", "fused_1stage")

    def body(comm):
        x, residual, weight = inputs(0, comm.rank, 2)
        a = comm.prepare_fused_allreduce_rmsnorm(x, residual, weight)
        b = comm.prepare_fused_allreduce_rmsnorm(x.clone(), residual, weight)
        a(), b()                                  # the same order on every rank: fine
        comm.fused_allreduce_rmsnorm(x, residual, weight)  # (grows the simulator's pool)
        if comm.rank == 0:
            first = (lambda: comm.fused_allreduce_rmsnorm(x, residual, weight)) \
                if other == "the plain call" else b
        else:
            first = a
        seen = []
        for call in (first, a):
            try:
                call()
                seen.append("returned")
            except CommunicatorBroken:
                seen.append("broken")
            except CollectiveError as e:
                seen.append(type(e).__name__)
        return seen, str(comm.broken)

    results = peerdsl.sim.run(2, body, seed=1, spin_limit=3000)
    for seen, _ in results:
        assert seen[0] in ("CollectiveMismatch", "CollectiveAborted") and seen[1] == "broken"
    mismatch = [first for seen, first in results if seen[0] == "CollectiveMismatch"]
    assert mismatch and any("fused_allreduce_rmsnorm[prepared #" in m for m in mismatch)


def test_preparing_is_collective_and_agreed(monkeypatch):
    """A rank whose inputs fail the checks raises its own error and its peers a named
    RuntimeError (nobody waits for it); ranks preparing different calls all raise."""
    def body(comm):
        x, residual, weight = inputs(0, comm.rank, 2)
        got = []
        bad = residual[:1] if comm.rank == 1 else residual
        try:
            comm.prepare_fused_allreduce_rmsnorm(x, bad, weight)
        except (ValueError, RuntimeError) as e:
            got.append((type(e).__name__, str(e)[:120]))
        try:
            comm.prepare_all_reduce(x if comm.rank == 0 else x[:1])
        except ValueError as e:
            got.append((type(e).__name__, str(e)[:200]))
        prep = comm.prepare_all_reduce(x)          # agreed: prepared everywhere
        got.append(same(prep(), all_reduce_ref(comm.exchange(x))))
        return got

    r0, r1 = peerdsl.sim.run(2, body, seed=1)
    assert r0[0][0] == "RuntimeError" and "rank 1: ValueError: residual has shape" in r0[0][1]
    assert r1[0][0] == "ValueError" and r1[0][1].startswith("residual has shape")
    for r in (r0, r1):
        assert r[1][0] == "ValueError" and "ranks prepared different calls" in r[1][1]
        assert "all_reduce(bf16[2, 2880])" in r[1][1] and "all_reduce(bf16[1, 2880])" in r[1][1]
        assert r[2] is True


def test_paths_without_a_prepared_form_make_the_plain_call(monkeypatch):
    """A non-contiguous input (the unfused path) and the torch.distributed fallback: each
    call is the plain call (its own sequence number), its result copied into the bound
    outputs."""
    monkeypatch.setenv("PEERDSL_CUSTOM_AR_MAX_BYTES", "64")   # every all-reduce: fallback

    def body(comm):
        x, residual, weight = inputs(0, comm.rank, 3)
        strided = x.t().contiguous().t()                       # the same values, transposed
        prep = comm.prepare_fused_allreduce_rmsnorm(strided, residual, weight)
        ar = comm.prepare_all_reduce(x)
        seq = comm._seq
        got = [t.clone() for t in prep()]
        reduced = ar().clone()
        return (prep.path, prep.fast, ar.path, ar.fast, comm._seq - seq,
                fused_ok(got, 0, 2, comm.rank, 3),
                same(reduced, all_reduce_ref([inputs(0, r, 3)[0] for r in range(2)])))

    for rep in peerdsl.sim.run(2, body, seed=1):
        assert rep == ("unfused", False, "fallback", False, 2, True, True), rep


def test_prepared_call_is_refused_once_broken(monkeypatch):
    """Rank 1's call fails its input check (its sequence number is used), so its next
    prepared call carries another call's tag: every rank raises a collective error, and
    every later call, prepared or plain, raises CommunicatorBroken."""
    monkeypatch.setenv("PEERDSL_FUSED_PATH", "fused_1stage")

    def body(comm):
        x, residual, weight = inputs(0, comm.rank, 2)
        prep = comm.prepare_fused_allreduce_rmsnorm(x, residual, weight)
        prep()
        if comm.rank == 1:
            with pytest.raises(ValueError):
                comm.fused_allreduce_rmsnorm(x, residual[:1], weight)
        seen = []
        for call in (prep, prep, lambda: comm.fused_allreduce_rmsnorm(x, residual, weight)):
            try:
                call()
                seen.append("returned")
            except CommunicatorBroken:
                seen.append("broken")
            except CollectiveError as e:
                seen.append(type(e).__name__)
        return seen, comm.broken is not None

    for seen, broken in peerdsl.sim.run(2, body, seed=1, spin_limit=3000,
                                        rendezvous_timeout_s=20.0):
        assert broken and seen == ["CollectiveMismatch", "broken", "broken"], seen


def test_prepared_call_after_close_raises_and_launches_nothing():
    def body(comm):
        x, residual, weight = inputs(0, comm.rank, 2)
        prep = comm.prepare_fused_allreduce_rmsnorm(x, residual, weight)
        ar = comm.prepare_all_reduce(x)
        prep()
        launches = comm.job.launches
        comm.barrier()
        comm.close()
        raised = []
        for call in (prep, ar, lambda: comm.prepare_all_reduce(x)):
            with pytest.raises(CommunicatorClosed):
                call()
            raised.append(True)
        return raised, comm.job.launches == launches

    assert peerdsl.sim.run(2, body) == [([True] * 3, True)] * 2


def test_prepare_checks_like_the_plain_call():
    def body(comm):
        x, residual, weight = inputs(0, comm.rank, 2)
        errors = []
        for kw, exc in (({"out": residual}, ValueError),            # overlaps an input
                        ({"out": torch.empty(3, H, dtype=BF16)}, ValueError),
                        ({"bogus": 1}, TypeError),
                        ({"fp8_out": True, "out": torch.empty(2, H, dtype=BF16)}, ValueError)):
            with pytest.raises(exc) as e:
                comm.prepare_fused_allreduce_rmsnorm(x, residual, weight, **kw)
            errors.append(str(e.value))
        with pytest.raises(ValueError, match="residual has shape"):
            comm.prepare_fused_allreduce_rmsnorm(x, residual[:1], weight)
        empty = comm.prepare_fused_allreduce_rmsnorm(x[:0], residual[:0], weight)
        seq = comm._seq
        got = empty()
        return errors, empty.path, comm._seq - seq, tuple(got[0].shape), comm.job.launches

    for errors, path, used, shape, launches in peerdsl.sim.run(2, body):
        assert path == "empty" and used == 1 and shape == (0, H) and launches == 0
        assert "out overlaps residual" in errors[0] and "bogus" in errors[2]


# ---------------------------------------------------------------------------- GPU (fakes)
WORLD, RANK, CAP = 4, 1, 33
GPU_OPS = {  # op -> the constexprs of its one built variant here
    "fused_ar_rms_1stage": {"T": "bf16", "H": H, "W": WORLD, "FP8": "e4m3fn"},
    "add_rmsnorm": {"T": "bf16", "H": H, "FP8": "e4m3fn"},
    "allreduce_ll": {"T": "bf16", "W": WORLD},
    "allreduce_1stage": {"T": "bf16", "W": WORLD},
}


def write_ops_manifest(root) -> tuple[str, dict[str, list[int]]]:
    """A sm_90 manifest of the shipped kernels (layouts from their traces, fake cubins) and
    each symbol's parameter sizes (what the fake driver decodes kernelParams with)."""
    from peerdsl.ops.registry import load_all
    from peerdsl.runtime.launch_args import annotate_args
    from test_runtime_loader_helpers import fake_elf, kernel_entry
    from test_user_launch_gpu_fake import natural_layout
    ops = load_all()
    d = root / "sm_90"
    d.mkdir(parents=True, exist_ok=True)
    kernels, sizes = {}, {}
    for op, cx in GPU_OPS.items():
        k = ops[op].kernel
        traced = k.trace(**cx)
        name = k.instance_name(**cx)
        args, size = natural_layout(traced)
        data = fake_elf("sm_90", name.encode())
        (d / f"{name}.cubin").write_bytes(data)
        kernels[name] = dict(kernel_entry(name, op, annotate_args(args, k, traced), size,
                                          jsonable(cx), data, "cubin"),
                             block_size=traced.block_size)
        sizes[name] = [a["size"] for a in args]
    doc = {"arch": "sm_90", "vendor": "nvidia", "wave_size": 32, "fp8_format": "e4m3fn",
           "compiler": {"name": "test"}, "kernels": kernels}
    (d / "manifest.json").write_text(json.dumps(doc))
    return str(d / "manifest.json"), sizes


class OpsDriver(FakeDriver):
    """The fake driver, decoding each kernel's own parameter sizes; with `strict_ctx` a
    launch fails as the driver's would while another context than the primary is current."""

    def __init__(self, sizes):
        super().__init__()
        self.sizes, self.strict_ctx = sizes, 0  # strict: the only context launches accept

    def cuModuleGetFunction(self, module, name):
        res = super().cuModuleGetFunction(module, name)
        res[1].sizes = self.sizes[name.decode()]
        return res

    def cuLaunchKernel(self, f, *rest):
        if self.strict_ctx and int(self.current) != self.strict_ctx:
            self.calls.append(("cuLaunchKernel", f.symbol, "refused"))
            return (CUresult.CUDA_ERROR_INVALID_VALUE,)
        return super().cuLaunchKernel(f, *rest)


@pytest.fixture(params=["buffer", "params"])
def gpu(request, monkeypatch, tmp_path):
    from peerdsl.runtime import communicator as cm
    from peerdsl.runtime import cuda as pcuda
    from peerdsl.runtime.cuda import _driver, ipc
    from peerdsl.runtime.cuda.loader import CudaLoader
    path, sizes = write_ops_manifest(tmp_path)
    fake_dist = types.SimpleNamespace(
        get_rank=lambda g=None: RANK, get_world_size=lambda g=None: WORLD,
        all_gather_object=lambda out, obj, group=None: out.__setitem__(slice(None),
                                                                        [obj] * WORLD),
        barrier=lambda group=None: None, get_backend=lambda g=None: "gloo")
    monkeypatch.setitem(sys.modules, "torch.distributed", fake_dist)
    monkeypatch.setattr(torch, "distributed", fake_dist, raising=False)
    monkeypatch.setattr(cm, "_arch_of", lambda d: "sm_90")
    monkeypatch.setattr(torch.cuda, "get_device_properties",
                        lambda d: types.SimpleNamespace(multi_processor_count=132))
    monkeypatch.setattr(torch.cuda, "synchronize", lambda d=None: None)
    opened = iter(range(1, 1000))
    monkeypatch.setattr(ipc, "ipc_export", lambda t, n, device=0: ipc.IpcHandle(b"h" * 64, 0, n))
    monkeypatch.setattr(ipc, "ipc_open", lambda h, device=0: next(opened) << 32)
    monkeypatch.setattr(ipc, "ipc_close", lambda a: None)
    monkeypatch.setattr(cm.Communicator, "_resident_cap", lambda self, k: CAP)
    monkeypatch.setattr(cm.Communicator, "_stream_capturing", staticmethod(lambda: False))
    pcuda.clear_caches()
    drv = OpsDriver(sizes)
    with _driver.use_driver(drv):
        loader = CudaLoader(path, device=0, mode=request.param)
        monkeypatch.setattr(cm.Communicator, "_make_loader", staticmethod(lambda m: loader))
        comm = cm.Communicator(device="cpu", max_size=1 << 20, ll_max_bytes=64 << 10,
                               staging_bytes=1 << 20, check_errors=False)
        comm.fake, comm.mode = drv, request.param
        yield comm
    pcuda.clear_caches()


def launched_fields(comm, rec) -> dict:
    """The last launch's arguments decoded at the manifest's offsets (not with PackPlan)."""
    entry = next(e for e in comm.loader.manifest.kernels.values() if e.symbol == rec["symbol"])
    if rec["extra"] is not None:
        data = rec["extra"][1]
        blobs = [data[a.offset:a.offset + a.size] for a in entry.args]
    else:
        blobs = rec["params"]
    codes = {"i32": "<i", "i64": "<q", "f32": "<f"}
    return {a.name: struct.unpack("<Q" if a.type.is_pointer else codes[a.type.scalar], b)[0]
            for a, b in zip(entry.args, blobs)}


def gpu_inputs(rows=4):
    x, residual, weight = inputs(0, RANK, rows)
    return x, residual, weight


def test_gpu_prepared_call_patches_the_tag_and_makes_one_driver_call(gpu):
    fake = gpu.fake
    x, residual, weight = gpu_inputs()
    gpu.fused_allreduce_rmsnorm(x, residual, weight)            # plain: seq 1
    assert gpu.last_path == "fused_1stage"
    plain = launched_fields(gpu, fake.launches[-1])
    code = (plain["call"] ^ (1 * SEQ_MULT)) & layout.TAG_MASK   # what the tag hashes
    staged = gpu.prepare_fused_allreduce_rmsnorm(x, residual, weight, stage_input=True)
    staged()                                                     # seq 2: the plain tag
    assert launched_fields(gpu, fake.launches[-1])["call"] == tag_of(2, code)
    prep = gpu.prepare_fused_allreduce_rmsnorm(x, residual, weight)
    assert (prep.path, prep.launches, prep.fast) == ("fused_1stage", 1, True)
    op, *rest = gpu._call_log.recent[-1][2]                   # read in place: its own tag
    key = ("fused_allreduce_rmsnorm[prepared #1, input in place]", *rest)
    code = code_of(key)
    shared = next(k for k in prep._keep if type(k).__name__ == "PeerBuffer")
    assert shared.address == x.data_ptr() and len(set(shared.addresses)) == WORLD
    for seq in (3, 4, 5):
        calls = len(fake.calls)
        got = prep()
        assert fake.calls[calls:] == [("cuLaunchKernel", fake.launches[-1]["symbol"])]
        rec = fake.launches[-1]
        assert rec["grid"] == (4, 1, 1) and gpu._seq == seq
        f = launched_fields(gpu, rec)
        assert f["call"] == tag_of(seq, code)
        assert gpu._call_log.recent[-1] == (seq, f["call"], key)  # named in error messages
        # x is read in place through its own table row: every rank's address of x
        assert f["inp"] == shared.table.data_ptr()
        assert shared.table.tolist() == layout.peer_row(list(shared.addresses))
        assert (f["out"], f["residual_out"]) == (got.out.data_ptr(),
                                                 got.residual_out.data_ptr())
        same_as_plain = {k: v for k, v in f.items()
                         if k not in ("call", "inp", "out", "residual_out")}
        assert same_as_plain == {k: v for k, v in plain.items()
                                 if k not in ("call", "inp", "out", "residual_out")}
        assert same_as_plain["residual"] == residual.data_ptr()
        assert [same_as_plain[f"sig_{i}"] for i in range(WORLD)] == gpu.signal_peers


def test_gpu_prepared_call_runs_no_torch_operation_and_little_python(gpu, monkeypatch):
    with monkeypatch.context() as m:  # the dispatch mode imports torch._dynamo, which needs
        m.setitem(sys.modules, "torch.distributed", REAL_DIST)  # the real torch.distributed
        m.setattr(torch, "distributed", REAL_DIST)
        importlib.import_module("torch._dynamo")
    x, residual, weight = gpu_inputs()
    prep = gpu.prepare_fused_allreduce_rmsnorm(x, residual, weight)
    staged = gpu.prepare_fused_allreduce_rmsnorm(x, residual, weight, stage_input=True)
    prep()

    class Ops(TorchDispatchMode):
        def __init__(self):
            super().__init__()
            self.ops = []

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            self.ops.append(str(func))
            return func(*args, **(kwargs or {}))

    with Ops() as seen:
        prep()
    assert seen.ops == []                       # no allocation, no copy, no view
    with Ops() as seen:
        staged()
    assert seen.ops == ["aten.copy_.default"]  # only the staged input's copy into the pool
    frames: list[str] = []
    package = os.path.dirname(layout.__file__)  # peerdsl/
    decoding = ("read_extra", "read_params", "<listcomp>")  # the fake driver's, not ours

    def trace(frame, event, arg):
        code = frame.f_code
        if event == "call" and code.co_filename.startswith(package) and \
                code.co_name not in decoding:
            frames.append(code.co_name)
    sys.setprofile(trace)
    try:
        prep()
    finally:
        sys.setprofile(None)
    # __call__, the call's closure, the launch closure, torch's stream lookup stand-in
    assert len(frames) <= 4, frames


def test_gpu_prepared_all_reduce_ll_and_one_stage(gpu, monkeypatch):
    x = inputs(0, RANK, 4, 512)[0]
    ll = gpu.prepare_all_reduce(x)
    monkeypatch.setenv("PEERDSL_LL_MAX_BYTES", "0")
    monkeypatch.setenv("PEERDSL_TWO_STAGE_MIN_WORLD", "8")  # one-stage at TP4
    one = gpu.prepare_all_reduce(x, stage_input=True)
    assert (ll.path, one.path) == ("ll", "1stage")
    ll()
    f = launched_fields(gpu, gpu.fake.launches[-1])
    assert (f["x"], f["out"], f["n_packs"]) == (x.data_ptr(), ll.result.data_ptr(), 256)
    assert f["lines_per_peer"] == gpu.ll_lines_per_peer
    one()
    f = launched_fields(gpu, gpu.fake.launches[-1])
    assert (f["inp"], f["out"], f["n_packs"]) == (gpu.tables.base, one.result.data_ptr(), 256)
    # the staged input went into the pool, where the table's row 0 points
    assert same(gpu._pool[:x.numel() * 2].view(BF16).view(x.shape), x)


def test_gpu_launch_failure_breaks_the_communicator(gpu):
    x, residual, weight = gpu_inputs()
    prep = gpu.prepare_fused_allreduce_rmsnorm(x, residual, weight)
    gpu.fake.fail = {"cuLaunchKernel": CUresult.CUDA_ERROR_INVALID_VALUE}
    with pytest.raises(RuntimeError, match="cuLaunchKernel.*fused_ar_rms_1stage"):
        prep()
    assert isinstance(gpu.broken, RuntimeError)
    gpu.fake.fail = {}
    launched = len(gpu.fake.launches)
    for call in (prep, lambda: gpu.fused_allreduce_rmsnorm(x, residual, weight),
                 lambda: gpu.prepare_all_reduce(x)):
        with pytest.raises(CommunicatorBroken, match="cuLaunchKernel"):
            call()
    assert len(gpu.fake.launches) == launched


def test_gpu_recorded_error_breaks_the_communicator_with_check_errors(gpu):
    from peerdsl.runtime.errors import CollectiveTimeout
    gpu.check_each_call = True
    x, residual, weight = gpu_inputs()
    prep = gpu.prepare_fused_allreduce_rmsnorm(x, residual, weight)
    prep()                                   # no error recorded: nothing raised
    at = layout.SIG_ERROR * 4
    record = [1, 2, 3, layout.WAIT_END, 7, 5] + [0] * (layout.ERROR_WORDS - 6)
    gpu._buffer[at:at + 4 * layout.ERROR_WORDS].copy_(
        torch.tensor(record, dtype=torch.int32).view(torch.uint8))
    with pytest.raises(CollectiveTimeout, match="fused_ar_rms_1stage"):
        prep()
    with pytest.raises(CommunicatorBroken):
        prep()


def test_gpu_prepared_call_after_close_raises_before_launching(gpu):
    x, residual, weight = gpu_inputs()
    prep = gpu.prepare_fused_allreduce_rmsnorm(x, residual, weight)
    prep()
    launched = len(gpu.fake.launches)
    gpu.close()
    with pytest.raises(CommunicatorClosed):
        prep()
    with pytest.raises(CommunicatorClosed):
        gpu.prepare_fused_allreduce_rmsnorm(x, residual, weight)
    assert len(gpu.fake.launches) == launched


def test_gpu_prepared_launch_recovers_from_a_foreign_current_context(gpu):
    """A launch made while another context is current fails without launching; the
    prepared launch makes the primary context current and launches once more."""
    x, residual, weight = gpu_inputs()
    prep = gpu.prepare_fused_allreduce_rmsnorm(x, residual, weight)
    fake = gpu.fake
    primary = int(fake.current)              # made current when the kernel was loaded
    fake.strict_ctx, fake.current = primary, Handle(0xBEEF)
    launched = len(fake.launches)
    prep()
    assert len(fake.launches) == launched + 1 and int(fake.current) == primary
    assert ("cuLaunchKernel", fake.launches[-1]["symbol"], "refused") in fake.calls
    calls = len(fake.calls)
    prep()                                   # now current: one driver call again
    assert [c[0] for c in fake.calls[calls:]] == ["cuLaunchKernel"]


# ---------------------------------------------------------------------------- the loader
@pytest.mark.parametrize("mode", ["params", "buffer"])
def test_prepared_launch_sends_what_the_trusted_launch_sends(fake, man, mode):
    """CudaKernel.prepare: the same record as launch_trusted (bytes, grid, block, stream),
    a named 4-byte argument patched in place between launches, nothing repacked."""
    from cuda_fakes import A, B
    from peerdsl.runtime import cuda as pcuda
    k = pcuda.CudaLoader(man, device=0, mode=mode).kernel("peer_probe")
    values = {"rank": 1, "world": 2, "epoch": -9, "scale": 2.0, "sig": [A, B]}
    def sent(rec):  # the record without the host addresses of the argument arrays
        return dict(rec, extra=rec["extra"] and rec["extra"][1])
    k.launch_trusted(3, values, stream=0x5EED)
    want = sent(fake.launches[-1])
    prepared = k.prepare(3, values, stream=0x5EED)
    prepared.launcher()()
    assert sent(fake.launches[-1]) == want
    tagged = prepared.launcher(["world"])
    for value in (5, 0x7FFFFFFF):
        calls = len(fake.calls)
        tagged(value)
        assert [c[0] for c in fake.calls[calls:]] == ["cuLaunchKernel"]
        k.launch_trusted(3, dict(values, world=value), stream=0x5EED)
        assert sent(fake.launches[-1]) == sent(fake.launches[-2])
    assert struct.unpack_from("<i", prepared.data, 68)[0] == 0x7FFFFFFF
    with pytest.raises(KeyError, match="no 4-byte scalar argument 'sig_0'"):
        prepared.word("sig_0")
    with pytest.raises(KeyError, match="'epoch'"):   # 8 bytes: not a tag word
        prepared.word("epoch")
