"""`peerdsl.Communicator`: the collectives on real GPUs, over a torch.distributed group.

Per rank it owns one peer-visible allocation holding the meta buffer of SPEC section 4
(Signal | LL scratch | staging) and the registered input pool: a torch allocation shared by
CUDA IPC handles (allocator="ipc", the default, proven on the H200), or a cuMemCreate one
shared as a file descriptor (allocator="vmm": the kind gfx1250 peers need). Handles are
exchanged through the group once; peers' addresses are opened here. Kernels come from the
ahead-of-time manifest (no MLIR at run time).

The one- and two-stage kernels read their peers' inputs through a device-side table of
addresses (runtime/peer_tables.py). Eager calls copy the input into the registered pool
(table row 0); under `graph_capture()` each call records its input's address in a fresh row
and copies nothing, and when the capture ends the recorded buffers are shared through the
group and their rows filled, so replays read the captured buffers in place. The LL path
reads its input in place always. Signal and epochs live in device memory, so graph replay
advances them like eager calls do.
"""
from __future__ import annotations

import functools
import os
from typing import Any

import numpy as np
import torch

from .. import layout
from . import dispatch
from .built import from_manifest
from .collectives import Collectives
from .graph_capture import GraphCapture
from .errors import CollectiveTimeout, CommunicatorClosed
from .peer_buffers import PeerBuffers
from .peer_tables import PeerTables
from .user_launch import UserLaunch

MiB = 1 << 20
SPIN_ITERATIONS_PER_SECOND = 2_000_000  # a system-scope poll takes >= 0.5 us on every target


def _device_bytes(ptr: int, nbytes: int, device: torch.device) -> torch.Tensor:
    """A uint8 tensor over device memory torch did not allocate (it does not own it)."""
    class _Raw:
        __cuda_array_interface__ = {"shape": (nbytes,), "typestr": "|u1",
                                    "data": (ptr, False), "version": 3}
    return torch.as_tensor(_Raw(), device=device)


def _arch_of(device: torch.device) -> str:
    major, minor = torch.cuda.get_device_capability(device)
    if torch.version.hip is not None:
        return torch.cuda.get_device_properties(device).gcnArchName.split(":")[0]
    return f"sm_{major}{minor}"


class Communicator(UserLaunch, PeerBuffers, GraphCapture, Collectives):
    """One rank's communicator; every rank of `group` constructs it together. User kernels:
    `launch`, `register`, `peer_buffer`, `signal` (user_launch.py, peer_buffers.py)."""

    def __init__(self, group: Any = None, device: Any = None, max_size: int = 64 * MiB,
                 build_dir: str | None = None, timeout_s: float = 5.0,
                 ll_max_bytes: int = layout.LL_MAX_BYTES,
                 staging_bytes: int = layout.STAGING_BYTES, max_grid: int | None = None,
                 check_errors: bool = True, allocator: str = "ipc",
                 max_graph_buffers: int = 16384):
        import torch.distributed as dist
        if allocator not in ("ipc", "vmm"):
            raise ValueError(f"allocator {allocator!r} is not one of 'ipc' (cudaMalloc memory "
                             "shared by IPC handles) or 'vmm' (cuMemCreate memory shared as "
                             "file descriptors)")

        self._dist, self.group = dist, group
        self.rank = dist.get_rank(group)
        self.world = dist.get_world_size(group)
        if not 1 <= self.world <= layout.MAX_RANKS:
            raise ValueError(f"world size {self.world} is not supported; it must be in "
                             f"[1, {layout.MAX_RANKS}]")
        self.device = torch.device(device if device is not None else
                                   f"cuda:{torch.cuda.current_device()}")
        self.dev_index = self.device.index or 0
        self.arch = _arch_of(self.device)
        build_dir = build_dir or os.environ.get("PEERDSL_BUILD_DIR", "build")
        self.loader = self._make_loader(os.path.join(build_dir, self.arch, "manifest.json"))
        self.fp8_format = self.loader.manifest.fp8_format
        # before any allocation or exchange (every rank reads the same manifest and raises)
        self.built = from_manifest(self.loader.manifest, build_dir)
        self.built.check_world(self.world)
        props = torch.cuda.get_device_properties(self.device)
        # Blocks of one index wait for each other across ranks, so every rank's grid must be
        # resident at once: ranks sharing a GPU (MPS) split its multiprocessors, one block
        # per SM each (an occupancy-based split, tried on the H200, left no slack and timed
        # out under MPS), and each collective kernel is also capped by its occupancy.
        self._sms = props.multi_processor_count
        self._sharing = self._ranks_on_this_gpu(props)
        self.max_grid = max(1, min(layout.MAX_BLOCKS, max_grid or (
            self._sms * (2 if self._sharing == 1 else 1) // self._sharing)))
        self.meta_layout = layout.MetaLayout(self.world, ll_max_bytes, staging_bytes)
        self.max_size = self.pool_bytes = max_size
        self.check_each_call = check_errors
        self._capturing = False
        self._kernels: dict[tuple, Any] = {}

        total = self.meta_layout.total_bytes + max_size
        self.allocator = allocator
        self._opened: list[Any] = []  # peers' mappings, released by close()
        self.peer_bases = self._share_vmm(total) if allocator == "vmm" else self._share_ipc(total)
        self._pool = self._buffer[self.meta_layout.total_bytes:]
        self._pool_views: dict[tuple, torch.Tensor] = {}
        at = layout.SIG_ERROR * 4  # a view made once: slicing costs more than the read
        self._error_flag = self._buffer[at:at + 4].view(torch.int32)
        # 64 bytes per captured call: 16384 rows cover ~67 graph sizes x 2 calls x 120 layers
        self.tables = PeerTables(max_graph_buffers + 1, self.world, self.rank, self.device)
        self.tables.set_row(0, self.pool_peers)
        self._graph_opened: list[int] = []  # peers' captured buffers mapped here
        self._graph_inputs: list[torch.Tensor] = []  # aligned copies captured graphs read
        self.set_timeout(timeout_s)
        torch.cuda.synchronize(self.device)
        dist.barrier(group=group)

    def _ranks_on_this_gpu(self, props: Any) -> int:
        """How many ranks of the group run on this rank's physical GPU (by its UUID, so
        per-rank CUDA_VISIBLE_DEVICES and MPS sharing both count right)."""
        import socket
        mine = f"{socket.gethostname()}:{getattr(props, 'uuid', '') or self.dev_index}"
        everyone: list[Any] = [None] * self.world
        self._dist.all_gather_object(everyone, mine, group=self.group)
        return max(1, everyone.count(mine))

    def _share_ipc(self, total: int) -> list[int]:
        """Every rank's address of a zeroed torch allocation, through CUDA IPC handles."""
        from .cuda.ipc import IpcHandle, ipc_close, ipc_export, ipc_open
        self._buffer = torch.zeros(total, dtype=torch.uint8, device=self.device)
        torch.cuda.synchronize(self.device)
        handle = ipc_export(self._buffer, total, device=self.dev_index).to_bytes()
        handles: list[Any] = [None] * self.world
        self._dist.all_gather_object(handles, handle, group=self.group)
        bases = []
        try:
            for r, h in enumerate(handles):
                if r == self.rank:
                    bases.append(self._buffer.data_ptr())
                else:
                    addr = ipc_open(IpcHandle.from_bytes(h), device=self.dev_index)
                    self._opened.append(addr)
                    bases.append(addr)
        except BaseException:
            for addr in self._opened:  # what was mapped before the failure
                ipc_close(addr)
            raise
        return bases

    def _share_vmm(self, total: int) -> list[int]:
        """Every rank's address of a cuMemCreate allocation (what gfx1250 peers need),
        exported as a file descriptor and passed to each peer over a unix socket."""
        from .cuda import vmm
        own = vmm.vmm_alloc(total, self.dev_index)
        self._vmm_own = own
        self._buffer = _device_bytes(own.ptr, total, self.device)
        self._buffer.zero_()
        bases, self._opened = vmm.share_with_peers(
            own, self.rank, self.world,
            lambda out, obj: self._dist.all_gather_object(out, obj, group=self.group),
            self.dev_index)
        return bases

    @staticmethod
    def _make_loader(manifest: str) -> Any:
        if not os.path.exists(manifest):
            raise FileNotFoundError(
                f"no kernel manifest at {manifest}: build it with `peerdsl build --arch "
                f"{os.path.basename(os.path.dirname(manifest))} -o "
                f"{os.path.dirname(os.path.dirname(manifest))}` (or set PEERDSL_BUILD_DIR)")
        from .cuda.loader import CudaLoader
        return CudaLoader(manifest)

    # ------------------------------------------------------------------ addresses
    @property
    def meta_bases(self) -> list[int]:
        return self.peer_bases

    @functools.cached_property
    def pool_peers(self) -> list[int]:
        return [b + self.meta_layout.total_bytes for b in self.peer_bases]

    # ------------------------------------------------------------------ primitives
    def _dev(self, t: torch.Tensor) -> torch.Tensor:
        if t.device != self.device:
            raise ValueError(f"tensor on {t.device}; this communicator runs on {self.device}")
        return t.contiguous()

    def _addr(self, buf: torch.Tensor) -> int:
        return buf.data_ptr()

    def _new(self, shape: tuple, dtype: torch.dtype) -> torch.Tensor:
        return torch.empty(shape, dtype=dtype, device=self.device)

    def _get(self, buf: torch.Tensor, shape: tuple, dtype: torch.dtype) -> torch.Tensor:
        return buf if buf.shape == shape else buf.view(shape)  # a view costs ~3 us

    def _stage(self, t: torch.Tensor) -> int:
        t = self._dev(t)
        nbytes = t.numel() * t.element_size()
        if nbytes > self.max_size:
            raise ValueError(f"{nbytes} bytes exceed the registered pool of {self.max_size} "
                             "bytes (Communicator max_size)")
        if self._capturing and self._stream_capturing():
            if t.data_ptr() % 16:  # the kernels read 16-byte packs in place: an aligned copy,
                t = t.clone()      # kept as long as the graphs may replay (until close())
                self._graph_inputs.append(t)
            return self.tables.reserve(t.data_ptr(), nbytes)  # registered after the capture
        key = (t.dtype, t.shape)
        dst = self._pool_views.get(key)
        if dst is None:  # a typed view of the pool per shape, made once (views cost us each)
            if len(self._pool_views) > 64:
                self._pool_views.clear()
            dst = self._pool_views[key] = self._pool[:nbytes].view(t.dtype).view(t.shape)
        dst.copy_(t)
        return self.tables.base

    @staticmethod
    def _stream_capturing() -> bool:
        return torch.cuda.is_current_stream_capturing()

    def _launch(self, name: str, constexprs: dict, grid: int, args: dict,
                local: bool = False) -> None:
        # Call sites pass their constexprs in a fixed order, so the items need no sorting;
        # another order would only cache the same kernel twice.
        try:
            hit = self._kernels.get((name, *constexprs.items()))
        except TypeError:  # an unhashable constexpr value: _kernel_hit keys it by str()
            hit = None
        if hit is None:
            hit = self._kernel_hit(name, constexprs, local)
        if not local:
            grid = min(grid, hit[2])
            tag = self._call_id_for(name, constexprs, args)
            for param in hit[3]:  # the kernel's dsl.CallId parameters
                args[param] = tag
        hit[1](grid, args)
        if self.check_each_call and not local and not (self._capturing
                                                        and self._stream_capturing()):
            # the flag word alone says whether a spin expired; check_errors decodes the record
            if self._error_flag.item():  # synchronizes, as the full read did
                self.check_errors(name)

    def _kernel_hit(self, name: str, constexprs: dict, local: bool) -> tuple:
        """(kernel, trusted launcher, resident grid cap or None, CallId parameter names) of
        kernel `name` with `constexprs`, loaded once (the launches and prepared calls)."""
        try:
            key = (name, *constexprs.items())
            hit = self._kernels.get(key)
        except TypeError:  # an unhashable constexpr value
            key = (name, *((k, str(v)) for k, v in constexprs.items()))
            hit = self._kernels.get(key)
        if hit is None:
            kernel = self.loader.kernel(name, **constexprs)
            # Collectives checked every input: the trusted launch skips the per-tensor checks;
            # a collective kernel's grid is capped so every rank's blocks are resident at once
            hit = self._kernels[key] = (kernel, getattr(kernel, "launch_trusted", None)
                                        or functools.partial(kernel.launch, trusted=True),
                                        None if local else self._resident_cap(kernel),
                                        _call_params(kernel))
        return hit

    def _prepared_binder(self) -> Any:
        """How prepared calls (runtime/prepared.py) bind tensors and launch here."""
        from .prepared_bind import GpuBinder
        return GpuBinder(self)

    def _resident_cap(self, kernel: Any) -> int:
        """How many blocks of `kernel` each rank may launch so that the blocks of every rank
        sharing this GPU are resident together (they wait on each other): the kernel's
        occupancy times the multiprocessors, split between the sharing ranks."""
        from .cuda._driver import check, driver
        per_sm = int(check(driver().cuOccupancyMaxActiveBlocksPerMultiprocessor(
            kernel.function, kernel.entry.block_size, kernel.entry.dynamic_lds_bytes),
            f"occupancy of {kernel.entry.name}"))
        if per_sm < 1:
            raise RuntimeError(f"kernel {kernel.entry.name} cannot be resident on this GPU "
                               "(occupancy 0: too many registers or too much shared memory)")
        return max(1, per_sm * self._sms // self._sharing)

    def _fallback_all_reduce(self, x: torch.Tensor) -> torch.Tensor:
        backend = self._dist.get_backend(self.group)
        if backend == "gloo":
            if self._stream_capturing():  # torch would fail on the host copy, mid-capture
                reason = dispatch.fallback_reason(
                    dispatch.thresholds(self.arch, self.capacity),
                    x.numel() * x.element_size(), x.is_contiguous())
                raise RuntimeError(
                    f"all-reduce of shape {tuple(x.shape)} takes the torch.distributed "
                    f"fallback ({reason}), and this communicator's group is gloo, whose host "
                    "copies cannot be captured in a CUDA graph: capture calls the custom "
                    "path serves, or use an NCCL group")
            y = x.detach().cpu().clone()
            self._dist.all_reduce(y, group=self.group)
            return y.to(self.device)
        y = x.clone()
        self._dist.all_reduce(y, group=self.group)
        return y

    # ------------------------------------------------------------------ errors, timeouts
    def set_timeout(self, seconds: float) -> None:
        """How long a spin may wait before the kernel gives up and records an error."""
        if self._closed:
            raise CommunicatorClosed(self.rank)
        n = max(1, min(int(seconds * SPIN_ITERATIONS_PER_SECOND), 2**31 - 1))
        at = layout.SIG_SPIN_LIMIT * 4
        self._buffer[at:at + 4].copy_(torch.tensor([n], dtype=torch.int32).view(torch.uint8)
                                      .to(self.device))

    def check_errors(self, kernel_name: str = "") -> None:
        """Synchronize and raise the error a wait of this rank's kernels recorded (timeout,
        mismatch, abort); once broken, CommunicatorBroken. The record stays set: every later
        kernel (a graph replay, which no host check precedes) then sends the abort mark and
        gives up at once, so peers raise too instead of consuming its data."""
        self._refuse()
        at = layout.SIG_ERROR * 4
        rec = self._buffer[at:at + 4 * layout.ERROR_WORDS].cpu().numpy().view(np.int32).copy()
        if rec[0] != 0:
            raise self._record_error(rec, kernel_name)

    def _write_signal(self, word: int, values: Any) -> None:
        """i32 words into this rank's Signal, between calls of every rank (collective)."""
        torch.cuda.synchronize(self.device)
        self._dist.barrier(group=self.group)  # no peer's kernel is still writing our slots
        data = torch.from_numpy(np.ascontiguousarray(values, np.int32)).view(torch.uint8)
        self._buffer[4 * word:4 * word + data.numel()].copy_(data.to(self.device))
        torch.cuda.synchronize(self.device)
        self._dist.barrier(group=self.group)  # every rank's words are set before a launch

    # ------------------------------------------------------------------ lifetime
    def close(self) -> None:
        """Release peer mappings and this rank's memory (collective the first time; a second
        close() does nothing). Every later call raises CommunicatorClosed before it
        launches or writes anything, so no kernel runs with the freed peer addresses."""
        if self._closed:
            return
        self._closed = True
        torch.cuda.synchronize(self.device)
        self._dist.barrier(group=self.group)  # no peer reads this rank's memory any more
        self._release_peer_buffers()
        if self.allocator == "vmm":
            from .cuda import vmm
            for mapped in self._opened:
                vmm.vmm_free(mapped)
        else:
            from .cuda.ipc import ipc_close
            for addr in self._opened:
                ipc_close(addr)
        self._drop_graph_buffers()
        self._opened = []
        self._buffer = self._pool = self._error_flag = None  # type: ignore[assignment]
        self._pool_views = {}
        if self.allocator == "vmm":
            vmm.vmm_free(self._vmm_own)
        self._dist.barrier(group=self.group)

    def __enter__(self) -> "Communicator":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


def _call_params(kernel: Any) -> tuple[str, ...]:
    """The names of a loaded kernel's runtime-filled `dsl.CallId` parameters (the manifest
    records their role); the shipped kernels name theirs `call`."""
    args = getattr(getattr(kernel, "entry", None), "args", None)
    if args is None:
        return ("call",)
    if not any(getattr(a, "role", "") for a in args):  # a manifest without roles
        return tuple(a.name for a in args if a.name == "call")
    return tuple(a.name for a in args if a.role == "call_id")
