"""The GPU Communicator's host side on the CPU: driver, IPC and kernels replaced by fakes, so
construction, dispatch and the argument tables it launches with are checked in CI."""
from __future__ import annotations

import os
import types

import pytest
import torch

from peerdsl import layout
from peerdsl.runtime import communicator as cm
from peerdsl.runtime.built import from_registry


class FakeKernel:
    def __init__(self, log, name, constexprs):
        self.log, self.name, self.constexprs = log, name, constexprs

    def launch(self, grid, args, trusted=False):
        assert trusted  # the communicator checks its inputs, then takes the fast path
        self.log.append((self.name, dict(self.constexprs), grid, dict(args)))


class FakeLoader:
    def __init__(self, log):
        self.log = log
        # the kernels sm_90 builds (op and constexprs: what the world / hidden checks read)
        kernels = {f"{op}_{i}": types.SimpleNamespace(op=op, constexprs=c)
                   for op, cs in from_registry("sm_90").variants.items()
                   for i, c in enumerate(cs)}
        self.manifest = types.SimpleNamespace(fp8_format="e4m3fn", arch="sm_90",
                                              path="fake/manifest.json", kernels=kernels)

    def kernel(self, name, **constexprs):
        return FakeKernel(self.log, name, constexprs)


@pytest.fixture(params=["ipc", "vmm"])
def comm(monkeypatch, request):
    log: list = []
    world, rank = 4, 1
    fake_dist = types.SimpleNamespace(
        get_rank=lambda g=None: rank, get_world_size=lambda g=None: world,
        all_gather_object=lambda out, obj, group=None: out.__setitem__(
            slice(None), [obj] * world),
        barrier=lambda group=None: None, get_backend=lambda g=None: "gloo")
    monkeypatch.setitem(__import__("sys").modules, "torch.distributed", fake_dist)
    monkeypatch.setattr(torch, "distributed", fake_dist, raising=False)
    monkeypatch.setattr(cm, "_arch_of", lambda d: "sm_90")
    monkeypatch.setattr(cm.Communicator, "_make_loader", staticmethod(lambda m: FakeLoader(log)))
    monkeypatch.setattr(torch.cuda, "get_device_properties",
                        lambda d: types.SimpleNamespace(multi_processor_count=132))
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    monkeypatch.setattr(torch.cuda, "synchronize", lambda d=None: None)
    from peerdsl.runtime.cuda import ipc
    opened = iter(range(1, 100))
    monkeypatch.setattr(ipc, "ipc_export", lambda t, n, device=0: ipc.IpcHandle(b"h" * 64, 0, n))
    monkeypatch.setattr(ipc, "ipc_open", lambda h, device=0: (next(opened) << 32))
    from peerdsl.runtime.cuda import fdexchange, vmm
    freed = []
    monkeypatch.setattr(vmm, "vmm_alloc", lambda n, d: vmm.VmmAllocation(7 << 40, n, "h", d,
                                                                         False))
    monkeypatch.setattr(vmm, "vmm_export_fd", lambda a: os.open(os.devnull, os.O_RDONLY))
    monkeypatch.setattr(vmm, "vmm_import_fd", lambda fd, n, d: vmm.VmmAllocation(
        (fd + 100) << 32, n, "p", d, True))
    monkeypatch.setattr(vmm, "vmm_free", lambda a: freed.append(a))
    monkeypatch.setattr(fdexchange, "exchange_fds", lambda fd, r, w, ag: [
        None if p == r else os.open(os.devnull, os.O_RDONLY) for p in range(w)])
    monkeypatch.setattr(cm, "_device_bytes", lambda ptr, n, d: torch.zeros(n, dtype=torch.uint8))
    monkeypatch.setattr(cm.Communicator, "_resident_cap", lambda self, k: 33)
    c = cm.Communicator(device="cpu", max_size=1 << 20, ll_max_bytes=64 << 10,
                        staging_bytes=1 << 20, allocator=request.param)
    c.log, c.freed = log, freed
    return c


def test_construction_and_close(comm):
    assert (comm.rank, comm.world, comm.arch, comm.fp8_format) == (1, 4, "sm_90", "e4m3fn")
    assert comm.max_grid == 33  # four ranks share 132 multiprocessors
    own = comm._buffer.data_ptr() if comm.allocator == "ipc" else 7 << 40
    assert comm.meta_bases[1] == own and len(set(comm.meta_bases)) == 4
    assert comm.signal_peers == comm.meta_bases
    assert comm.ll_peers[0] == comm.meta_bases[0] + layout.SIGNAL_BYTES
    spin = comm._buffer[layout.SIG_SPIN_LIMIT * 4:][:4].view(torch.int32).item()
    assert spin == 5 * cm.SPIN_ITERATIONS_PER_SECOND
    if comm.allocator == "vmm":
        from peerdsl.runtime.cuda import ipc  # noqa: F401 - the ipc path is not used
        comm.close()
        assert len(comm.freed) == 4  # three peers' mappings and its own allocation


def test_fused_paths_and_arguments(comm, monkeypatch):
    monkeypatch.delenv("PEERDSL_FUSED_PATH", raising=False)
    monkeypatch.setenv("PEERDSL_FUSED_LL_MAX_BYTES", str(1 << 20))  # sm_90 has no fused LL
    monkeypatch.setenv("PEERDSL_FUSED_TWO_STAGE_MIN_BYTES", "0")    # nor small two-stage
    x = torch.randn(2, 6144).to(torch.bfloat16)
    res, w = torch.randn(2, 6144).to(torch.bfloat16), torch.ones(6144, dtype=torch.bfloat16)
    comm.fused_allreduce_rmsnorm(x, res, w)  # 24 KiB: under the 64 KiB LL scratch
    assert comm.last_path == "ll+rmsnorm"  # one launch: sm_90 builds fused_ar_rms_ll
    (fll, cx, grid, args), = comm.log
    assert (fll, cx) == ("fused_ar_rms_ll", {"T": "bf16", "H": 6144, "B": 256, "W": 4,
                                              "FP8": "e4m3fn"})
    assert args["ll"] == comm.ll_peers and args["rank"] == 1 and args["rows"] == 2
    assert args["lines_per_peer"] == (64 << 10) // 8 and grid == 2 and args["flags"] == 0
    comm.log.clear()
    comm.force_runtime_h = True  # it is specialized only: the two launches
    comm.fused_allreduce_rmsnorm(x, res, w)
    (ll, cx, grid, args), (rms, _, _, rargs) = comm.log
    assert (ll, rms, cx) == ("allreduce_ll", "add_rmsnorm_runtime_h", {"T": "bf16", "W": 4})
    assert args["ll"] == comm.ll_peers and args["rank"] == 1 and args["n_packs"] == 1536
    assert args["lines_per_peer"] == (64 << 10) // 8 and grid == 6
    assert rargs["rows"] == 2 and rargs["flags"] == 0
    comm.force_runtime_h = False
    comm.log.clear()
    x = torch.randn(16, 6144).to(torch.bfloat16)
    res = torch.randn(16, 6144).to(torch.bfloat16)
    comm.fused_allreduce_rmsnorm(x, res, w, fp8_out=True)  # 192 KiB: two-stage, TP4
    assert comm.last_path == "fused_2stage"
    name, cx, grid, args = comm.log[0]
    assert name == "fused_ar_rms_2stage" and grid == 16
    assert args["inp"] == comm.tables.base and args["staging"] == comm.staging_peers
    assert comm.tables.tensor[0, :4].tolist() == comm.pool_peers
    assert args["flags"] == 2 and args["q"].dtype == torch.int8


def test_gloo_fallback_refuses_graph_capture_clearly(comm, monkeypatch):
    """Over the custom limit under a CUDA graph capture with a gloo group: an error naming
    the size, the limit and the ways out (torch's own failure on the host copy came from
    deep inside the call), before anything is copied."""
    monkeypatch.setenv("PEERDSL_CUSTOM_AR_MAX_BYTES", "1024")
    monkeypatch.setattr(comm, "_stream_capturing", lambda: True)
    x = torch.ones(16, 64, dtype=torch.bfloat16)
    with pytest.raises(RuntimeError, match=r"shape \(16, 64\) .*\(2048 bytes, over the "
                       r"custom path's 1024\).*gloo.*CUDA graph"):
        comm.all_reduce(x)
    with pytest.raises(RuntimeError, match=r"\(14 bytes, not a multiple of 16\)"):
        comm.all_reduce(torch.ones(7, dtype=torch.bfloat16))
    with pytest.raises(RuntimeError, match=r"\(a non-contiguous input\)"):
        comm.all_reduce(torch.ones(8, 16, dtype=torch.bfloat16).t())


def test_pool_limit_sends_big_inputs_to_the_fallback(comm, monkeypatch):
    monkeypatch.setattr(comm, "_fallback_all_reduce", lambda t: t * 4)
    x = torch.ones(1 << 20, dtype=torch.bfloat16)  # 2 MiB > the 1 MiB pool
    assert torch.equal(comm.all_reduce(x), x * 4) and comm.last_path == "fallback"


def test_graph_capture_reads_inputs_in_place_and_registers_them_after(comm, monkeypatch):
    monkeypatch.delenv("PEERDSL_FUSED_PATH", raising=False)
    capturing = [False]
    monkeypatch.setattr(comm, "_stream_capturing", lambda: capturing[0])
    w = torch.ones(6144, dtype=torch.bfloat16)
    warm = torch.full((16, 6144), 2.0).to(torch.bfloat16)
    x = torch.full((16, 6144), 3.0).to(torch.bfloat16)
    res = torch.zeros(16, 6144, dtype=torch.bfloat16)
    with comm.graph_capture():
        comm.fused_allreduce_rmsnorm(warm, res, w)  # eager warm-up: copied into the pool
        assert comm.log[-1][3]["inp"] == comm.tables.base
        capturing[0] = True
        comm.fused_allreduce_rmsnorm(x, res, w)
        comm.all_gather(x)
        capturing[0] = False
        assert comm.log[-2][3]["inp"] == comm.tables.row_address(1)
        assert comm.log[-1][3]["inp"] == comm.tables.row_address(2)
        assert not comm.tables.tensor[1:3].any()  # filled only when the capture ends
    pool = comm._pool[:x.numel() * 2].view(torch.bfloat16)
    assert torch.equal(pool, warm.view(-1))  # the captured calls copied nothing
    for row in (1, 2):
        addrs = comm.tables.tensor[row].tolist()
        assert addrs[comm.rank] == x.data_ptr() and addrs[4:] == [0] * 4
        peers = [a for r, a in enumerate(addrs[:4]) if r != comm.rank]
        assert all(peers) and len(set(peers)) == 3
    assert len(comm._graph_opened) == 6


def test_graph_capture_must_enclose_the_torch_capture(comm, monkeypatch):
    monkeypatch.setattr(comm, "_stream_capturing", lambda: True)
    with pytest.raises(RuntimeError, match="outside torch.cuda.graph"):
        with comm.graph_capture():
            pass


def test_collective_grids_are_capped_by_occupancy_split_between_sharing_ranks(monkeypatch):
    from peerdsl.runtime.cuda import _driver
    fake = types.SimpleNamespace(
        cuOccupancyMaxActiveBlocksPerMultiprocessor=lambda f, block, smem: (0, 2),
        CUresult=types.SimpleNamespace(CUDA_SUCCESS=0))
    monkeypatch.setattr(_driver, "_driver", fake)
    monkeypatch.setattr(_driver, "check", lambda res, what: res[1])
    c = object.__new__(cm.Communicator)
    c._sms, c._sharing = 132, 4
    kernel = types.SimpleNamespace(function=object(), entry=types.SimpleNamespace(
        block_size=256, dynamic_lds_bytes=0, name="fused"))
    assert c._resident_cap(kernel) == 66  # 2 per SM x 132 SMs / 4 ranks on the GPU
    monkeypatch.setattr(_driver, "check", lambda res, what: 0)
    with pytest.raises(RuntimeError, match="occupancy 0"):
        c._resident_cap(kernel)


def test_eager_launch_raises_the_recorded_timeout_then_refuses(comm, monkeypatch):
    from peerdsl.runtime.errors import CollectiveTimeout, CommunicatorBroken
    monkeypatch.setattr(comm, "_stream_capturing", lambda: False)
    at = layout.SIG_ERROR * 4
    words = comm._buffer[at:at + 4 * layout.ERROR_WORDS]
    comm.null_collective()                       # no error recorded: nothing raised
    record = [1, 2, 3, layout.WAIT_END, 7, 5] + [0] * (layout.ERROR_WORDS - 6)
    words.copy_(torch.tensor(record, dtype=torch.int32).view(torch.uint8))
    with comm.graph_capture():
        monkeypatch.setattr(comm, "_stream_capturing", lambda: True)
        comm.null_collective()                   # a captured launch never reads it
        monkeypatch.setattr(comm, "_stream_capturing", lambda: False)
    with pytest.raises(CollectiveTimeout, match="in kernel null_collective") as e:
        comm.null_collective()
    assert e.value.reporter == 1
    assert (e.value.rank, e.value.block, e.value.what, e.value.expected, e.value.seen) == \
        (2, 3, layout.WAIT_END, 7, 5)
    # the rule after an error: the record stays set (later kernels send the abort mark) and
    # every later call is refused before it launches
    assert words.view(torch.int32).tolist() == record and comm.broken is e.value
    launched = len(comm.log)
    for call in (comm.null_collective, lambda: comm.all_reduce(torch.ones(8)),
                 comm.check_errors):
        with pytest.raises(CommunicatorBroken, match="null_collective: rank 2 block 3"):
            call()
    assert len(comm.log) == launched


def test_close_is_idempotent_and_later_calls_launch_nothing(comm, monkeypatch):
    from peerdsl.runtime.cuda import ipc
    from peerdsl.runtime.errors import CommunicatorClosed
    closed: list = []
    monkeypatch.setattr(ipc, "ipc_close", closed.append)
    x = torch.ones(64, dtype=torch.bfloat16)
    comm.all_reduce(x)                           # the LL path: peer addresses cached
    launched, freed = len(comm.log), len(comm.freed)
    comm.close()
    comm.close()                                 # nothing freed or closed twice
    assert len(comm.freed) == freed + (4 if comm.allocator == "vmm" else 0)
    assert len(closed) == (3 if comm.allocator == "ipc" else 0)
    for call in (lambda: comm.all_reduce(x), comm.null_collective, lambda: comm.all_gather(x),
                 lambda: comm.add_rmsnorm(x.view(1, 64), x.view(1, 64), x),
                 comm.check_errors, lambda: comm.set_timeout(1.0)):
        with pytest.raises(CommunicatorClosed):
            call()
    assert len(comm.log) == launched


def test_kernels_are_looked_up_once(comm, monkeypatch):
    monkeypatch.delenv("PEERDSL_FUSED_PATH", raising=False)
    monkeypatch.setenv("PEERDSL_FUSED_TWO_STAGE_MIN_BYTES", "0")
    calls = []
    kernel = comm.loader.kernel
    monkeypatch.setattr(comm.loader, "kernel", lambda name, **cx: calls.append(name) or
                        kernel(name, **cx))
    x = torch.randn(2, 6144).to(torch.bfloat16)
    w = torch.ones(6144, dtype=torch.bfloat16)
    for _ in range(3):
        comm.fused_allreduce_rmsnorm(x, x, w)
    monkeypatch.setenv("PEERDSL_FUSED_LL_MAX_BYTES", str(1 << 20))  # sm_90 has no fused LL
    monkeypatch.setenv("PEERDSL_FUSED_TWO_STAGE_MIN_BYTES", "0")    # nor small two-stage
    for _ in range(3):
        comm.fused_allreduce_rmsnorm(x, x, w)
    assert calls == ["fused_ar_rms_2stage", "fused_ar_rms_ll"]
    assert len(comm.log) == 3 + 3


def test_graph_capture_failures_reach_every_rank(comm, monkeypatch):
    from peerdsl.runtime.errors import CollectiveTimeout
    capturing = [False]
    monkeypatch.setattr(comm, "_stream_capturing", lambda: capturing[0])
    sent = []
    real = comm._dist.all_gather_object
    monkeypatch.setattr(comm._dist, "all_gather_object",
                        lambda out, obj, group=None: (sent.append(obj), real(out, obj, group)))
    # an eager warm-up inside the context checks errors like any eager call
    at = layout.SIG_ERROR * 4
    comm._buffer[at:at + 4].copy_(torch.tensor([1], dtype=torch.int32).view(torch.uint8))
    with pytest.raises(CollectiveTimeout):
        with comm.graph_capture():
            comm.null_collective()
    assert sent == [f"rank 1: {CollectiveTimeout(0, 0, 0, 0, 0, 'null_collective', 1)!r}"]
    assert not comm._capturing and comm.tables.next_row == 1


def test_graph_capture_nesting_and_alignment(comm, monkeypatch):
    capturing = [False]
    monkeypatch.setattr(comm, "_stream_capturing", lambda: capturing[0])
    # nesting is refused, and the outer context still registers at its exit
    with comm.graph_capture():
        with pytest.raises(RuntimeError, match="already open"):
            with comm.graph_capture():
                pass
        # a misaligned input is captured through an aligned copy kept alive
        capturing[0] = True
        buf = torch.zeros(4 * 1024 + 8, dtype=torch.bfloat16)
        comm.all_gather(buf[1:4 * 1024 + 1])
        capturing[0] = False
    row = comm.tables.tensor[1]
    assert row[comm.rank] % 16 == 0 and row[comm.rank] == comm._graph_inputs[0].data_ptr()


def test_ranks_sharing_a_gpu_are_counted_by_its_uuid():
    c = object.__new__(cm.Communicator)
    c.world, c.group, c.dev_index = 4, None, 0
    props = types.SimpleNamespace(uuid="GPU-a")
    for peers, want in ((["GPU-a"] * 4, 4), (["GPU-a", "GPU-b", "GPU-c", "GPU-d"], 1),
                        (["GPU-a", "GPU-a", "GPU-b", "GPU-b"], 2)):
        def gather(out, obj, group=None, peers=peers):
            host = obj.split(":")[0]
            out[:] = [f"{host}:{p}" for p in peers]
        c._dist = types.SimpleNamespace(all_gather_object=gather)
        assert c._ranks_on_this_gpu(props) == want


def test_release_graph_buffers_closes_peer_mappings_and_frees_rows(comm, monkeypatch):
    from peerdsl.runtime.cuda import ipc
    closed = []
    monkeypatch.setattr(ipc, "ipc_close", closed.append)
    capturing = [False]
    monkeypatch.setattr(comm, "_stream_capturing", lambda: capturing[0])
    x = torch.ones(4096, dtype=torch.bfloat16)
    with comm.graph_capture():
        capturing[0] = True
        comm.all_gather(x)
        capturing[0] = False
    opened = list(comm._graph_opened)
    assert len(opened) == 3 and comm.tables.next_row == 2 and comm.tables.tensor[1].any()
    comm.release_graph_buffers()
    assert closed == opened and not comm._graph_opened
    assert comm.tables.next_row == 1 and not comm.tables.tensor[1:].any()
    assert comm.tables.tensor[0, :4].tolist() == comm.pool_peers  # the pool's row stays


def test_collective_launches_are_clamped_to_the_resident_cap_and_local_ones_are_not(
        comm, monkeypatch):
    monkeypatch.delenv("PEERDSL_FUSED_PATH", raising=False)
    monkeypatch.setattr(cm.Communicator, "_resident_cap", lambda self, k: 5)
    comm._kernels.clear()
    x = torch.randn(64, 6144).to(torch.bfloat16)
    w = torch.ones(6144, dtype=torch.bfloat16)
    comm.fused_allreduce_rmsnorm(x, x, w)
    comm.add_rmsnorm(x, x, w)
    (fused, _, fused_grid, _), (local, _, local_grid, _) = comm.log[-2:]
    assert fused.startswith("fused_ar_rms_") and fused_grid == 5
    assert local == "add_rmsnorm" and local_grid == 64  # one block per row, no co-residency
