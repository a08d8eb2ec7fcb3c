"""`comm.launch` on the GPU Communicator, on the CPU: the real Communicator, CudaLoader (and
HipLoader) and packing against the CUDA/HIP fakes, with a manifest of user kernels whose
layouts and annotations come from their traces. Checks the bytes launched, the lookups, the
errors, staging in and out of `graph_capture()`, and register/peer_buffer/close."""
from __future__ import annotations

import json
import os
import struct
import types

import pytest
import torch

from cuda_fakes import FakeDriver
from peerdsl import dsl
from peerdsl.dsl import PeerPtrs, Ptr, RegisteredPtrs, constexpr
from peerdsl.lowering.cache import jsonable
from peerdsl.runtime import communicator as cm
from peerdsl.runtime.launch_args import LaunchArgError, annotate_args
from peerdsl.runtime.manifest import ManifestError
from test_runtime_loader_helpers import fake_elf, kernel_entry

WORLD, RANK, CAP = 4, 1, 33


@dsl.kernel(block_size=64)
def gpu_allreduce_scale(inp: PeerPtrs["T"], out: Ptr["T"], sig: PeerPtrs[dsl.i32], rank: dsl.i32,
                        n_packs: dsl.i32, scale: dsl.f32, T: constexpr, W: constexpr):
    signal = dsl.Signal(sig, rank, W)
    signal.start()
    P = dsl.vec16(T)
    for i in range(dsl.block_id() * 64 + dsl.thread_id(), n_packs, dsl.num_blocks() * 64):
        acc = inp[0].cast(P)[i].to_f32()
        for r in range(1, W):
            acc = [a + b for a, b in zip(acc, inp[r].cast(P)[i].to_f32())]
        out.cast(P)[i] = dsl.pack_rne([a * scale for a in acc], T)
    signal.end()


@dsl.kernel(block_size=64)
def gpu_reg_sum(inp: RegisteredPtrs["T"], out: Ptr["T"], sig: PeerPtrs[dsl.i32], rank: dsl.i32,
                n_packs: dsl.i32, T: constexpr, W: constexpr):
    signal = dsl.Signal(sig, rank, W)
    signal.start()
    P = dsl.vec16(T)
    for i in range(dsl.block_id() * 64 + dsl.thread_id(), n_packs, dsl.num_blocks() * 64):
        acc = inp[0].cast(P)[i].to_f32()
        for r in range(1, W):
            acc = [a + b for a, b in zip(acc, inp[r].cast(P)[i].to_f32())]
        out.cast(P)[i] = dsl.pack_rne(acc, T)
    signal.end()


@dsl.kernel(block_size=64)
def gpu_scale(x: Ptr[dsl.f32], a: dsl.f32, n: dsl.i32):
    i = dsl.block_id() * 64 + dsl.thread_id()
    if i < n:
        x[i] = a * x[i]


KERNELS = {"user_ar_scale": (gpu_allreduce_scale, {"T": dsl.bf16, "W": WORLD}),
           "user_reg_sum": (gpu_reg_sum, {"T": dsl.bf16, "W": WORLD}),
           "user_scale": (gpu_scale, {})}


def natural_layout(traced):
    """Each parameter at its natural alignment, in order (the PTX rule for sm_90)."""
    off, args = 0, []
    for p in traced.params:
        size = 8 if isinstance(p.type, dsl.ir.PtrType) else p.type.nbytes
        off = (off + size - 1) // size * size
        t = f"ptr<{p.type.elem}>" if isinstance(p.type, dsl.ir.PtrType) else p.type.name
        args.append({"name": p.name, "type": t, "offset": off, "size": size})
        off += size
    return args, (off + 7) // 8 * 8


def write_user_manifest(root, arch="sm_90"):
    d = root / arch
    d.mkdir(parents=True, exist_ok=True)
    ext = "cubin" if arch == "sm_90" else "hsaco"
    kernels = {}
    for op, (k, cx) in KERNELS.items():
        traced = k.trace(**cx)
        name = k.instance_name(**cx)
        args, size = natural_layout(traced)
        data = fake_elf(arch, name.encode())
        (d / f"{name}.{ext}").write_bytes(data)
        e = kernel_entry(name, op, annotate_args(args, k, traced), size, jsonable(cx), data, ext)
        kernels[name] = dict(e, block_size=traced.block_size)
    vendor = "nvidia" if arch == "sm_90" else "amd"
    doc = {"arch": arch, "vendor": vendor, "wave_size": 32, "fp8_format": "e4m3fn",
           "compiler": {"name": "test"}, "kernels": kernels}
    (d / "manifest.json").write_text(json.dumps(doc))
    return d / "manifest.json"


def make_comm(monkeypatch, tmp_path, allocator="ipc", loader=None):
    fake_dist = types.SimpleNamespace(
        get_rank=lambda g=None: RANK, get_world_size=lambda g=None: WORLD,
        all_gather_object=lambda out, obj, group=None: out.__setitem__(slice(None), [obj] * WORLD),
        barrier=lambda group=None: None, get_backend=lambda g=None: "gloo")
    monkeypatch.setitem(__import__("sys").modules, "torch.distributed", fake_dist)
    monkeypatch.setattr(torch, "distributed", fake_dist, raising=False)
    monkeypatch.setattr(cm, "_arch_of", lambda d: "sm_90")
    path = write_user_manifest(tmp_path)
    if loader is None:
        from peerdsl.runtime.cuda.loader import CudaLoader
        loader = CudaLoader(path, device=0, mode="buffer")  # the whole kernarg buffer is seen
    monkeypatch.setattr(cm.Communicator, "_make_loader", staticmethod(lambda m: loader))
    monkeypatch.setattr(torch.cuda, "get_device_properties",
                        lambda d: types.SimpleNamespace(multi_processor_count=132))
    monkeypatch.setattr(torch.cuda, "synchronize", lambda d=None: None)
    from peerdsl.runtime.cuda import fdexchange, ipc, vmm
    opened = iter(range(1, 1000))
    closed: list = []
    monkeypatch.setattr(ipc, "ipc_export", lambda t, n, device=0: ipc.IpcHandle(b"h" * 64, 0, n))
    monkeypatch.setattr(ipc, "ipc_open", lambda h, device=0: next(opened) << 32)
    monkeypatch.setattr(ipc, "ipc_close", lambda a: closed.append(a))
    owns = iter(range(7, 1000))
    monkeypatch.setattr(vmm, "vmm_alloc", lambda n, d: vmm.VmmAllocation(
        next(owns) << 40, (n + 4095) // 4096 * 4096, "h", d, False))
    monkeypatch.setattr(vmm, "vmm_export_fd", lambda a: os.open(os.devnull, os.O_RDONLY))
    monkeypatch.setattr(vmm, "vmm_import_fd", lambda fd, n, d: vmm.VmmAllocation(
        (fd + 100) << 32, n, "p", d, True))
    monkeypatch.setattr(vmm, "vmm_free", lambda a: closed.append(a))
    monkeypatch.setattr(fdexchange, "exchange_fds", lambda fd, r, w, ag: [
        None if p == r else os.open(os.devnull, os.O_RDONLY) for p in range(w)])
    monkeypatch.setattr(cm, "_device_bytes", lambda ptr, n, d: torch.zeros(n, dtype=torch.uint8))
    monkeypatch.setattr(cm.Communicator, "_resident_cap", lambda self, k: CAP)
    c = cm.Communicator(device="cpu", max_size=1 << 20, ll_max_bytes=64 << 10,
                        staging_bytes=1 << 20, allocator=allocator)
    c.closed = closed
    return c


@pytest.fixture
def fake():
    from peerdsl.runtime import cuda as pcuda
    from peerdsl.runtime.cuda import _driver
    pcuda.clear_caches()
    drv = FakeDriver()
    with _driver.use_driver(drv):
        yield drv
    pcuda.clear_caches()


@pytest.fixture
def comm(fake, monkeypatch, tmp_path):
    return make_comm(monkeypatch, tmp_path)


def fields(comm, op, data):
    """The launched bytes decoded at the manifest's offsets (independently of PackPlan)."""
    entry = comm.loader.manifest.find(op)
    codes = {"i32": "<i", "i64": "<q", "f32": "<f"}
    return {a.name: struct.unpack_from("<Q" if a.type.is_pointer else codes[a.type.scalar],
                                       data, a.offset)[0] for a in entry.args}


def launched(fake):
    rec = fake.launches[-1]
    return rec, rec["extra"][1]


def test_user_kernel_by_kernel_and_by_op_name_packs_the_right_bytes(comm, fake):
    x = torch.randn(8, 64).to(torch.bfloat16)
    inp = comm.register(x)
    own, peers = x.data_ptr(), [a for r, a in enumerate(inp) if r != RANK]
    assert inp.address == own and len(inp) == WORLD and all(peers) and len(set(peers)) == 3
    out = torch.zeros_like(x)
    comm.launch(gpu_allreduce_scale, grid=5, constexprs={"T": torch.bfloat16, "W": WORLD},
                inp=inp, out=out, sig=comm.signal, rank=RANK, n_packs=64, scale=0.25)
    rec, data = launched(fake)
    assert rec["grid"] == (5, 1, 1) and rec["block"] == (64, 1, 1)
    assert rec["symbol"] == gpu_allreduce_scale.instance_name(T=dsl.bf16, W=WORLD)
    got = fields(comm, "user_ar_scale", data)
    assert [got[f"inp_{i}"] for i in range(8)] == list(inp) + [inp[0]] * 4  # padded: first
    assert [got[f"sig_{i}"] for i in range(4)] == comm.signal_peers
    assert (got["out"], got["rank"], got["n_packs"], got["scale"]) == (out.data_ptr(), 1, 64,
                                                                         0.25)
    # by op name, constexprs naming a subset (one variant is built): the same bytes
    comm.launch("user_ar_scale", grid=5, constexprs={"T": "bf16"}, inp=inp, out=out,
                sig=comm.signal, rank=RANK, n_packs=64, scale=0.25)
    assert launched(fake)[1] == data
    # a kernel without peers runs with no resident cap: grid past it is fine
    y = torch.ones(1000)
    comm.launch(gpu_scale, grid=CAP + 100, x=y, a=2, n=1000)
    rec, data = launched(fake)
    assert rec["grid"] == (CAP + 100, 1, 1)
    assert fields(comm, "user_scale", data) == {"x": y.data_ptr(), "a": 2.0, "n": 1000}


def test_missing_variant_lists_the_built_ones_and_the_build_command(comm, tmp_path):
    with pytest.raises(ManifestError) as e:
        comm.launch(gpu_allreduce_scale, grid=1, constexprs={"T": "f16", "W": WORLD})
    msg = str(e.value)
    assert "kernel 'gpu_allreduce_scale' has no sm_90 build with constexprs {'T': 'f16', 'W': 4}" \
        in msg and "built variants: [{'T': 'bf16', 'W': 4}]" in msg
    assert (f"`peerdsl build --arch sm_90 --module {__name__} --ops user_ar_scale -o {tmp_path}`"
            in msg)
    with pytest.raises(ManifestError, match=r"op 'user_scale' has no sm_90 build.*\{'T': 'f32'\}"
                       r".*built variants: \[\{\}\]"):
        comm.launch("user_scale", grid=1, constexprs={"T": "f32"})
    with pytest.raises(ManifestError, match=r"op 'nope' has no sm_90 build.*nothing of it is "
                       r"built \(ops built: \['user_ar_scale'.*--ops nope"):
        comm.launch("nope", grid=1)
    with pytest.raises(TypeError, match="a registered op name"):
        comm.launch(42, grid=1)


def test_arguments_are_checked_against_the_manifest_signature(comm, fake):
    x = torch.zeros(8, 64, dtype=torch.bfloat16)
    good = dict(inp=comm.register(x), out=torch.zeros_like(x), sig=comm.signal, rank=RANK,
                n_packs=64, scale=1.0)
    cx = {"T": "bf16", "W": WORLD}
    cases = [({"n_packs": 2.0}, r"'n_packs' got float 2\.0; the kernel declares i32"),
             ({"out": torch.zeros(8, 64)}, r"'out' got a float32 tensor.*declares Ptr\[bf16\]"),
             ({"out": torch.zeros(520, dtype=torch.bfloat16)[4:516]},
              r"'out'.*not 16-byte aligned"),
             ({"out": torch.zeros(8, 64, dtype=torch.bfloat16, device="meta")},
              r"'out'.*the tensor is on meta; this communicator runs on cpu"),
             ({"inp": x}, r"'inp'.*PeerPtrs\[bf16\].*comm\.register\(tensor\)"),
             ({"sig": comm.register(torch.zeros(4, dtype=torch.int64))},
              r"'sig'.*dtype int64 is not the declared element i32"),
             ({"unknown": 1}, r"unknown arguments \['unknown'\]")]
    for change, pattern in cases:
        with pytest.raises(LaunchArgError, match=pattern):
            comm.launch("user_ar_scale", grid=1, constexprs=cx, **dict(good, **change))
    with pytest.raises(LaunchArgError, match=r"missing arguments \['scale'\]"):
        comm.launch("user_ar_scale", grid=1, constexprs=cx,
                    **{k: v for k, v in good.items() if k != "scale"})
    with pytest.raises(LaunchArgError, match=rf"grid {CAP + 1} exceeds {CAP}"):
        comm.launch("user_ar_scale", grid=CAP + 1, constexprs=cx, **good)
    assert not fake.launches  # nothing was launched by a failed check


def test_registered_ptrs_tensor_is_staged_eagerly_and_in_place_under_graph_capture(comm, fake,
                                                                                   monkeypatch):
    capturing = [False]
    monkeypatch.setattr(comm, "_stream_capturing", lambda: capturing[0])
    warm = torch.full((8, 64), 2.0).to(torch.bfloat16)
    x = torch.full((8, 64), 3.0).to(torch.bfloat16)
    out = torch.zeros_like(x)
    args = dict(out=out, sig=comm.signal, rank=RANK, n_packs=64)
    with comm.graph_capture():
        comm.launch(gpu_reg_sum, grid=2, constexprs={"T": "bf16", "W": WORLD}, inp=warm, **args)
        assert fields(comm, "user_reg_sum", launched(fake)[1])["inp"] == comm.tables.base
        capturing[0] = True
        comm.launch(gpu_reg_sum, grid=2, constexprs={"T": "bf16", "W": WORLD}, inp=x, **args)
        capturing[0] = False
        got = fields(comm, "user_reg_sum", launched(fake)[1])
        assert got["inp"] == comm.tables.row_address(1) and got["out"] == out.data_ptr()
        assert not comm.tables.tensor[1].any()        # filled when the capture ends
    pool = comm._pool[:x.numel() * 2].view(torch.bfloat16)
    assert torch.equal(pool, warm.view(-1))           # the captured launch copied nothing
    row = comm.tables.tensor[1].tolist()
    assert row[RANK] == x.data_ptr() and all(row[:WORLD]) and row[WORLD:] == [0] * 4
    # a registered PeerBuffer passes its own table (made once, on first use)
    reg = comm.register(x)
    comm.launch("user_reg_sum", grid=1, inp=reg, **args)
    table = fields(comm, "user_reg_sum", launched(fake)[1])["inp"]
    assert table == reg.table.data_ptr() and reg.table.tolist() == list(reg) + [0] * 4


def test_register_peer_buffer_and_close_release_the_mappings(fake, monkeypatch, tmp_path):
    for allocator in ("ipc", "vmm"):
        comm = make_comm(monkeypatch, tmp_path / allocator, allocator)
        with pytest.raises(ValueError, match="not contiguous"):
            comm.register(torch.zeros(4, 4).t())
        with pytest.raises(ValueError, match="is on meta"):
            comm.register(torch.zeros(4, device="meta"))
        pb = comm.peer_buffer((WORLD, 16), torch.float32)
        assert pb.tensor.shape == (WORLD, 16) and pb.tensor.dtype == torch.float32
        assert not pb.tensor.any() and len(set(pb)) == WORLD
        if allocator == "ipc":
            assert pb.address == pb.tensor.data_ptr()
        assert comm.signal.addresses == tuple(comm.signal_peers) and comm.signal.dtype == \
            torch.int32
        opened = [a for r, a in enumerate(pb) if r != RANK]
        before = list(comm.closed)
        comm.close()
        released = comm.closed[len(before):]
        if allocator == "ipc":
            assert set(opened) <= set(released)
        else:  # the peers' mappings and the own allocation
            assert {m.ptr for m in released} >= set(opened) | {pb.address}


def test_launch_through_the_hip_loader_interface(monkeypatch, tmp_path):
    """The same comm.launch with a HipLoader: the launch_trusted interface of loader_base."""
    from peerdsl.runtime import hip as phip
    from peerdsl.runtime.hip import _api
    from test_runtime_loader_hip import FakeHip
    phip.clear_caches()
    h = FakeHip()
    with _api.use_hip(h):
        loader = phip.HipLoader(write_user_manifest(tmp_path / "amd", "gfx1250"), device=0)
        comm = make_comm(monkeypatch, tmp_path, loader=loader)
        y = torch.ones(64)
        comm.launch(gpu_scale, grid=3, x=y, a=0.5, n=64)
        (rec,) = h.launches
        assert rec["grid"] == (3, 1, 1) and rec["block"] == (64, 1, 1)
        entry = loader.manifest.find("user_scale")
        offs = {a.name: a.offset for a in entry.args}
        data = rec["kernargs"]
        assert struct.unpack_from("<Q", data, offs["x"])[0] == y.data_ptr()
        assert struct.unpack_from("<f", data, offs["a"])[0] == 0.5
        assert struct.unpack_from("<i", data, offs["n"])[0] == 64
        with pytest.raises(LaunchArgError, match=r"'n' got float"):
            comm.launch(gpu_scale, grid=3, x=y, a=0.5, n=64.0)
    phip.clear_caches()


def test_manifest_records_roles_and_pack_alignment():
    traced = gpu_reg_sum.trace(T=dsl.bf16, W=WORLD)
    args = {a["name"]: a for a in annotate_args(natural_layout(traced)[0], gpu_reg_sum, traced)}
    assert (args["inp"]["role"], args["inp"]["elem"], args["inp"]["align"]) == (
        "registered_ptrs", "bf16", 16)       # the table's pointees are read as 16-byte packs
    assert (args["out"]["role"], args["out"]["align"]) == ("ptr", 16)
    assert {(args[f"sig_{i}"]["role"], args[f"sig_{i}"]["param"], args[f"sig_{i}"]["align"])
            for i in range(8)} == {("peer_ptrs", "sig", 8)}   # 8-byte {epoch, tag} slots
    assert args["rank"]["role"] == "scalar" and "align" not in args["rank"]
    traced = gpu_scale.trace()
    args = {a["name"]: a for a in annotate_args(natural_layout(traced)[0], gpu_scale, traced)}
    assert args["x"]["align"] == 4           # f32 accesses: no pack, no 16-byte demand


def test_missing_variant_among_many_names_the_closest_and_what_differs():
    """A shipped op builds hundreds of variants: the error lists the few nearest the query
    and the constexprs each differs in, not all of them."""
    from peerdsl.runtime.loader_base import _closest_listing
    built = [{"H": H, "W": W, "U": U, "B": 384 if H == 2880 else 256}
             for H in (2880, 6144, 8192) for W in (2, 4, 8) for U in (0, 2, 4) if U * W <= 8]
    msg = _closest_listing(built, {"H": 2880, "W": 4, "U": 4, "B": 384})
    assert msg.startswith(f"{len(built)} built variants; the closest")
    first = msg.split("differs in: ")[1].split("; ")[0]
    assert first.startswith("{'H': 2880") and first.endswith(("(U)", "(W)"))  # one key off
    assert msg.count("{'H'") == 8
    assert _closest_listing(built[:2], {"H": 1}).startswith("built variants: [")
