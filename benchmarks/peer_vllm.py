"""vLLM's custom all-reduce as a peer timed in our rank processes (issue 15: every ratio
measured side by side in one run), and the unfused pair a vLLM deployment runs: that
all-reduce, then a Triton add + RMSNorm, in one graph.

The kernels are vLLM's (benchmarks/peers/vllm_ar_shim.cu says where the header comes from;
scripts/peer_sources.sh puts it in peers_src/, which is git-ignored). `build_shim` compiles
the shim with the GPU machine's nvcc; `VllmAllReduce` sets up what vLLM's Python side would
(one Signal + scratch and one registered input buffer per rank, IPC handles exchanged over
the benchmark's gloo group) and launches a chosen kernel:

    ar = VllmAllReduce(build_shim("peers_src", out_dir), rank, world, dist, max_bytes)
    x_in = ar.input(torch, rows, hidden, dev)  # the registered buffer, bf16 [rows, hidden]
    ar.all_reduce(torch, x_in, out, stage=0)  # 0: vLLM's own 1-/2-stage rule; 1 or 2: forced
                                              # (3-6: one-stage, SPEC's / our barriers)
"""
from __future__ import annotations

import ctypes
import os
import shutil
import subprocess

SHIM = os.path.join(os.path.dirname(os.path.abspath(__file__)), "peers", "vllm_ar_shim.cu")
HEADER = "vllm_custom_all_reduce.cuh"
THREADS, BLOCK_LIMIT = 512, 36  # vLLM's launch: 36 blocks of 512 threads at most
RANK_DATA_BYTES = 1 << 20


def build_shim(header_dir: str, out_dir: str) -> str:
    """libvllm_ar.so built from the shim and `header_dir`/vllm_custom_all_reduce.cuh."""
    header = os.path.join(header_dir, HEADER)
    if not os.path.exists(header):
        raise FileNotFoundError(f"{header} is missing: run scripts/peer_sources.sh first")
    nvcc = shutil.which("nvcc") or "/usr/local/cuda/bin/nvcc"
    lib = os.path.join(out_dir, "libvllm_ar.so")
    if os.path.exists(lib) and os.path.getmtime(lib) > max(os.path.getmtime(SHIM),
                                                           os.path.getmtime(header)):
        return lib  # built by an earlier run of this call
    cmd = [nvcc, "-O3", "-std=c++17", "-arch=sm_90", "-shared", "-Xcompiler", "-fPIC",
           "-I", header_dir, SHIM, "-o", lib]
    done = subprocess.run(cmd, capture_output=True, text=True)
    if done.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} failed:\n{done.stdout[-2000:]}{done.stderr[-3000:]}")
    return lib


class _DeviceArray:
    """A raw device allocation seen by torch.as_tensor (the CUDA array interface)."""

    def __init__(self, ptr: int, nbytes: int):
        self.__cuda_array_interface__ = {"shape": (nbytes // 2,), "typestr": "<i2",
                                         "data": (ptr, False), "version": 3, "strides": None}


class VllmAllReduce:
    """One rank's vLLM custom all-reduce: Signal + scratch and an input buffer of
    `max_bytes` each, shared with every rank; collective to construct (every rank at once)."""

    def __init__(self, lib_path: str, rank: int, world: int, dist, max_bytes: int):
        lib = self.lib = ctypes.CDLL(lib_path)
        lib.vllm_ar_alloc.argtypes = [ctypes.c_size_t, ctypes.POINTER(ctypes.c_void_p),
                                      ctypes.c_char_p]
        lib.vllm_ar_open.argtypes = [ctypes.c_char_p, ctypes.POINTER(ctypes.c_void_p)]
        lib.vllm_ar_create.restype = ctypes.c_void_p
        lib.vllm_ar_create.argtypes = [ctypes.POINTER(ctypes.c_void_p), ctypes.c_void_p,
                                       ctypes.c_size_t, ctypes.c_int, ctypes.c_int]
        lib.vllm_ar_register.argtypes = [ctypes.c_void_p, ctypes.POINTER(ctypes.c_void_p)]
        lib.vllm_ar_bf16.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p,
                                     ctypes.c_long, ctypes.c_int, ctypes.c_int, ctypes.c_int,
                                     ctypes.c_void_p]
        lib.vllm_ar_destroy.argtypes = [ctypes.c_void_p]
        self.rank, self.world, self.max_bytes = rank, world, max_bytes
        handle_bytes = lib.vllm_ar_handle_bytes()
        meta, meta_handle = self._alloc(lib.vllm_ar_signal_bytes() + max_bytes, handle_bytes)
        buf, buf_handle = self._alloc(max_bytes, handle_bytes)
        rank_data, _ = self._alloc(RANK_DATA_BYTES, handle_bytes)
        handles: list = [None] * world
        dist.all_gather_object(handles, (meta_handle, buf_handle))
        signals = (ctypes.c_void_p * 8)()
        inputs = (ctypes.c_void_p * 8)()
        for r, (meta_h, buf_h) in enumerate(handles):
            signals[r] = meta if r == rank else self._open(meta_h)
            inputs[r] = buf if r == rank else self._open(buf_h)
        self.handle = lib.vllm_ar_create(signals, rank_data, RANK_DATA_BYTES, rank, world)
        self._check(lib.vllm_ar_register(self.handle, inputs), "register_buffer")
        self.buffer = buf
        dist.barrier()

    def _alloc(self, nbytes: int, handle_bytes: int) -> tuple[int, bytes]:
        ptr, handle = ctypes.c_void_p(), ctypes.create_string_buffer(handle_bytes)
        self._check(self.lib.vllm_ar_alloc(nbytes, ctypes.byref(ptr), handle), "alloc")
        return ptr.value, handle.raw

    def _open(self, handle: bytes) -> int:
        ptr = ctypes.c_void_p()
        self._check(self.lib.vllm_ar_open(handle, ctypes.byref(ptr)), "cudaIpcOpenMemHandle")
        return ptr.value

    @staticmethod
    def _check(code: int, what: str) -> None:
        if code != 0:
            raise RuntimeError(f"vLLM all-reduce shim: {what} returned {code}")

    def input(self, torch, rows: int, hidden: int, dev):
        """The registered input buffer as a [rows, hidden] bf16 tensor (vLLM reads it in
        place, as its graphs read registered buffers)."""
        nbytes = rows * hidden * 2
        if nbytes > self.max_bytes:
            raise ValueError(f"{nbytes} bytes exceed the peer buffer of {self.max_bytes}")
        flat = torch.as_tensor(_DeviceArray(self.buffer, self.max_bytes), device=dev)
        return flat[:rows * hidden].view(torch.bfloat16).view(rows, hidden)

    def all_reduce(self, torch, x_in, out, stage: int = 0) -> None:
        stream = torch.cuda.current_stream().cuda_stream
        self._check(self.lib.vllm_ar_bf16(self.handle, x_in.data_ptr(), out.data_ptr(),
                                          x_in.numel(), stage, BLOCK_LIMIT, THREADS, stream),
                    f"all-reduce (stage {stage})")


def peer_timings(torch, time_us, ar: VllmAllReduce, comm, tri, x, res, w, dev, sync) -> dict:
    """us per call of vLLM's one- and two-stage all-reduce of `x`, the Triton add + RMSNorm
    (every rank's at once, as in the fused kernels), and the pair a vLLM deployment runs
    (the faster vLLM all-reduce, then the Triton norm, in one graph); whether vLLM's
    one-stage result has our all-reduce's bytes (both sum in rank order)."""
    rows, hidden = x.shape
    x_in = ar.input(torch, rows, hidden, dev)
    x_in.copy_(x)
    out = torch.empty_like(x)
    norm_out, norm_res = torch.empty_like(x), torch.empty_like(x)
    torch.cuda.synchronize(dev)
    sync()
    ar.all_reduce(torch, x_in, out, stage=1)
    torch.cuda.synchronize(dev)
    ours = comm.all_reduce(x)
    got = {"vllm_1stage_equal": bool(torch.equal(out.view(torch.int16),
                                                 ours.view(torch.int16)))}
    # BENCH_VLLM_SPEC=1: also vLLM's one-stage kernel with SPEC section 3's barriers (3) and
    # with ours (4: plus the bounded polls that check the error word), and with SPEC's at
    # the start only (5) or the end only (6), and SPEC's with the end arrival right after the
    # last peer loads (7), the shim says how; each checked for the
    # one-stage kernel's bytes first
    stages = (1, 2, 3, 4, 5, 6, 7) if os.environ.get("BENCH_VLLM_SPEC") == "1" else (1, 2)
    for stage in stages[2:]:
        alt = torch.empty_like(out)
        sync()
        ar.all_reduce(torch, x_in, alt, stage=stage)
        torch.cuda.synchronize(dev)
        got[f"vllm_ar{stage}_equal"] = bool(torch.equal(alt.view(torch.int16),
                                                        out.view(torch.int16)))
    for stage in stages:
        got[f"vllm_ar{stage}_us"] = time_us(
            torch, lambda s=stage: ar.all_reduce(torch, x_in, out, stage=s), dev, sync)
    nbytes = x.numel() * 2  # vLLM's rule (the shim's stage 0), for the record
    got["vllm_rule_stage"] = 1 if (ar.world == 2 or ar.world <= 4 and nbytes < 512 << 10
                                   or ar.world <= 8 and nbytes < 256 << 10) else 2
    best = 1 if got["vllm_ar1_us"] <= got["vllm_ar2_us"] else 2
    got["vllm_ar_us"] = got[f"vllm_ar{best}_us"]
    got["triton_us"] = time_us(torch, lambda: tri(x, res, w, norm_out, norm_res), dev, sync)

    def pair():
        ar.all_reduce(torch, x_in, out, stage=best)
        tri(out, res, w, norm_out, norm_res)
    got["vllm_pair_us"] = time_us(torch, pair, dev, sync)
    return got


def peers_table(summary: dict) -> str:
    """The side-by-side table of a run with peers: ours against vLLM's all-reduce and against
    the vLLM + Triton pair, both as a caller runs it and as the sum of parts timed apart (the
    issue's baseline: the Triton norm alone on the GPU, `triton_alone_us`)."""
    lines = []
    alone = summary.get("triton_alone_us", {})
    for tp in [k for k in summary if k.startswith("tp")]:
        rows = {k: r for k, r in summary[tp]["rows"].items() if "vllm_ar_us" in r}
        if not rows:
            continue
        lines.append(f"\nTP{tp[2:]}: peers in the same run (us per call; ratio = peer / ours, "
                     "> 1: ours faster)")
        lines.append("| H | rows | our AR | vLLM AR 1-stage / 2-stage | AR ratio | our fused | "
                     "vLLM AR + Triton, one graph | ratio | vLLM AR + Triton alone (sum) | "
                     "ratio | our pair, one graph | 1-stage bytes equal |")
        lines.append("|---|---|---|---|---|---|---|---|---|---|---|---|")
        for key, r in rows.items():
            hidden, n = key.split(":")
            tri_alone = alone.get(hidden, {}).get(n)
            summed = r["vllm_ar_us"] + tri_alone if tri_alone is not None else None
            lines.append(
                f"| {hidden} | {n} | {r['ar_us']:.1f} | {r['vllm_ar1_us']:.1f} / "
                f"{r['vllm_ar2_us']:.1f} | {r['vllm_ar_us'] / r['ar_us']:.2f} | "
                f"{r['fused_us']:.1f} | {r['vllm_pair_us']:.1f} | "
                f"{r['vllm_pair_us'] / r['fused_us']:.2f} | "
                + (f"{summed:.1f} | {summed / r['fused_us']:.2f} | " if summed else "- | - | ")
                + f"{r.get('pair_us', float('nan')):.1f} | {r['vllm_1stage_equal']} |")
    return "\n".join(lines)
