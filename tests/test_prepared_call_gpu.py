"""Prepared calls on the GPU Communicator, on the CPU (issue 15 item 3): the real
Communicator, CudaLoader and packing against the CUDA fake, over a manifest of the shipped
kernels traced here. Each call patches the call tag in bytes packed once and makes exactly
one driver call, with the bytes the plain call would send; no torch operation per call;
launch failures and recorded errors break the communicator; close() refuses; a foreign
current context is recovered from. The simulator's half is tests/test_prepared_call.py."""
from __future__ import annotations

import importlib
import json
import os
import struct
import sys
import types

import pytest
import torch
import torch.distributed as REAL_DIST  # before the fixture's fake replaces it
from torch.utils._python_dispatch import TorchDispatchMode

from cuda_fakes import CUresult, FakeDriver, Handle
from peerdsl import layout
from peerdsl.lowering.cache import jsonable
from peerdsl.runtime.callid import SEQ_MULT, code_of, tag_of
from peerdsl.runtime.errors import CommunicatorBroken, CommunicatorClosed
from test_prepared_call import BF16, H, inputs, same

WORLD, RANK, CAP = 4, 1, 33
GPU_OPS = {  # op -> the constexprs of its one built variant here
    "fused_ar_rms_1stage": {"T": "bf16", "H": H, "W": WORLD, "FP8": "e4m3fn"},
    "add_rmsnorm": {"T": "bf16", "H": H, "FP8": "e4m3fn"},
    "allreduce_ll": {"T": "bf16", "W": WORLD},
    # every sm_90 variant at this world (dispatch.ar_kernel picks U and B by size)
    "allreduce_1stage": [{"T": "bf16", "W": WORLD, "U": U, "B": B}
                         for U in (1, 2, 4) for B in (256, 512, 1024)],
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
    for op, cx in [(op, cx) for op, cxs in GPU_OPS.items()
                   for cx in (cxs if isinstance(cxs, list) else [cxs])]:
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
    # the same variant (dispatch.ar_kernel's U and B) and tag code as the plain call
    prepared = gpu.fake.launches[-1]
    gpu.all_reduce(x)
    plain = gpu.fake.launches[-1]
    assert prepared["symbol"] == plain["symbol"] and (prepared["grid"] == plain["grid"])
    tag = launched_fields(gpu, plain)["call"]
    assert tag == tag_of(gpu._seq, (f["call"] ^ ((gpu._seq - 1) * SEQ_MULT)) & layout.TAG_MASK)


def test_gpu_prepare_refuses_a_tensor_on_another_device_before_the_exchange(gpu):
    x = torch.empty(4, 512, dtype=BF16, device="meta")
    with pytest.raises(ValueError, match="x is on meta; this communicator runs on cpu"):
        gpu.prepare_all_reduce(x)
    assert gpu.broken is None and not gpu.fake.launches


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
