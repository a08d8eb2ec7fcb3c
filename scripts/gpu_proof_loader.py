#!/usr/bin/env python3
"""GPU proof of the runtime loader on sm_90 (H100/H200): manifest -> cubin -> launch -> check.

Needs only torch + cuda-bindings + this repo on PYTHONPATH (no MLIR, no flydsl). Run:

    PYTHONPATH=. python3 scripts/gpu_proof_loader.py --manifest build   # DIR/sm_90/manifest.json

Checks (each PASS/FAIL, summary at the end, JSON to $OUT/loader_proof.json when OUT is set):
  builtin_vector_add   a hand-written PTX vector_add through a temporary manifest: proves the
                       loader (context, module, kernarg packing, both launch modes) apart
                       from the lowering
  vector_add[T,mode]   the manifest's vector_add (bf16 and f16 when built), out ==
                       T(f32(a) + f32(b)) bit for bit against torch, guard words untouched
  barrier_probe[W]     W ranks = W streams of this process, several rounds with changing
                       grids: every block passes the counter phase and sees all W stamps
                       through Signal.start/end; no error record
  barrier_timeout      one rank of W=2 alone with a small spin limit: the kernel must give
                       up and write its error record (rank, block, what=flag) instead of
                       hanging
  ipc_2proc            a torch buffer (at an offset in its allocation) shared with a child
                       process through cuIpcGetMemHandle/cuIpcOpenMemHandle, both ways
  vmm_fd_2proc         cuMemCreate memory exported as a POSIX fd, sent over a unix socket
                       (SCM_RIGHTS), imported + mapped by the child, both ways
  no_mlir              nothing MLIR-like got imported
"""
from __future__ import annotations

import sys

_PRELOADED = frozenset(sys.modules)  # what an embedding process (pytest) had imported already

import argparse  # noqa: E402
import json
import math
import os
import tempfile
import time
import traceback
from pathlib import Path
from typing import Any, Callable

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402

from peerdsl import layout  # noqa: E402
from peerdsl.runtime import cuda as pcuda  # noqa: E402
from peerdsl.runtime.manifest import KernelEntry, load_manifest  # noqa: E402

RESULTS: list[dict[str, Any]] = []
DEVICE = "cuda"  # tests dry-run the checks on "cpu" with a fake driver

# One 16-byte pack (8 x bf16) per thread: f32 add of both halves of each word, RNE back.
REF_PTX = r"""
.version 7.8
.target sm_90
.address_size 64

.visible .entry peerdsl_ref_vector_add_bf16(
	.param .u64 p_a, .param .u64 p_b, .param .u64 p_out, .param .u32 p_n
)
.maxntid 256, 1, 1
{
	.reg .pred %p<2>;
	.reg .b32 %r<48>;
	.reg .f32 %f<24>;
	.reg .b64 %rd<8>;
	mov.u32 %r1, %ctaid.x;
	mov.u32 %r2, %tid.x;
	mad.lo.s32 %r3, %r1, 256, %r2;
	ld.param.u32 %r4, [p_n];
	setp.ge.s32 %p1, %r3, %r4;
	@%p1 bra DONE;
	ld.param.u64 %rd1, [p_a];
	ld.param.u64 %rd2, [p_b];
	ld.param.u64 %rd3, [p_out];
	cvta.to.global.u64 %rd1, %rd1;
	cvta.to.global.u64 %rd2, %rd2;
	cvta.to.global.u64 %rd3, %rd3;
	mul.wide.s32 %rd4, %r3, 16;
	add.s64 %rd5, %rd1, %rd4;
	add.s64 %rd6, %rd2, %rd4;
	add.s64 %rd7, %rd3, %rd4;
	ld.global.v4.b32 {%r10, %r11, %r12, %r13}, [%rd5];
	ld.global.v4.b32 {%r14, %r15, %r16, %r17}, [%rd6];
""" + "".join(f"""
	shl.b32 %r{20 + 4 * k}, %r{10 + k}, 16;
	and.b32 %r{21 + 4 * k}, %r{10 + k}, -65536;
	shl.b32 %r{22 + 4 * k}, %r{14 + k}, 16;
	and.b32 %r{23 + 4 * k}, %r{14 + k}, -65536;
	mov.b32 %f{4 * k}, %r{20 + 4 * k};
	mov.b32 %f{4 * k + 1}, %r{21 + 4 * k};
	mov.b32 %f{4 * k + 2}, %r{22 + 4 * k};
	mov.b32 %f{4 * k + 3}, %r{23 + 4 * k};
	add.rn.f32 %f{16 + 2 * (k % 2)}, %f{4 * k}, %f{4 * k + 2};
	add.rn.f32 %f{17 + 2 * (k % 2)}, %f{4 * k + 1}, %f{4 * k + 3};
	cvt.rn.bf16x2.f32 %r{40 + k}, %f{17 + 2 * (k % 2)}, %f{16 + 2 * (k % 2)};""" for k in range(4)) + r"""
	st.global.v4.b32 [%rd7], {%r40, %r41, %r42, %r43};
DONE:
	ret;
}
"""


def check(name: str, fn: Callable[[], str]) -> bool:
    t0 = time.perf_counter()
    try:
        detail, ok = fn(), True
    except Exception as e:  # every check reports, none stops the run
        detail, ok = f"{type(e).__name__}: {e}\n{traceback.format_exc(limit=4)}", False
    dt = time.perf_counter() - t0
    RESULTS.append({"name": name, "ok": ok, "seconds": round(dt, 3), "detail": detail})
    print(f"[{'PASS' if ok else 'FAIL'}] {name} ({dt:.2f} s): {detail.splitlines()[0] if detail else ''}",
          flush=True)
    if not ok:
        print(detail, flush=True)
    return ok


def sync(streams: list[Any], timeout_s: float) -> None:
    """Wait for the streams with a deadline, so a hung kernel is reported, not waited on."""
    events = []
    for s in streams:
        ev = torch.cuda.Event()
        ev.record(s)
        events.append(ev)
    deadline = time.monotonic() + timeout_s
    while not all(ev.query() for ev in events):
        if time.monotonic() > deadline:
            raise TimeoutError(f"kernels still running after {timeout_s} s (hung barrier?)")
        time.sleep(0.0005)
    torch.cuda.synchronize()


def make_inputs(n_packs: int, dtype: torch.dtype, seed: int) -> tuple[torch.Tensor, ...]:
    g = torch.Generator(device="cpu").manual_seed(seed)
    n = n_packs * 8
    scale = torch.exp2(torch.randint(-20, 20, (n,), generator=g).float())
    a = (torch.randn(n, generator=g) * scale).to(dtype)
    b = (torch.randn(n, generator=g) * scale).to(dtype)
    if n >= 64:  # edge cases: ties, cancellation, tiny values, overflow to inf
        info = torch.finfo(dtype)
        a[:8] = torch.tensor([1.0, 1.0, -3.0, info.tiny, info.tiny, info.max, -info.max, 0.0])
        b[:8] = torch.tensor([2.0 ** -8, 3 * 2.0 ** -9, 3.0, -info.tiny / 2, info.tiny / 4,
                              info.max, -info.max, -0.0])
    return a.to(DEVICE), b.to(DEVICE)


def run_vector_add(kernel: Any, entry: KernelEntry, dtype: torch.dtype, mode: str) -> str:
    ptrs = [a.name for a in entry.args if a.type.is_pointer]
    ints = [a.name for a in entry.args if not a.type.is_pointer]
    if len(ptrs) != 3 or len(ints) != 1:
        raise ValueError(f"unexpected vector_add args {entry.arg_names}")
    bs = entry.block_size
    cases = [(1, None), (255, None), (256, None), (257, None), (1000, None), (65_539, None),
             (100_000, 7)]  # last: fewer blocks than packs (the DSL kernel grid-strides)
    if entry.symbol.startswith("peerdsl_ref"):
        cases = cases[:-1]     # the reference PTX does one pack per thread
    stream = torch.cuda.current_stream()
    for i, (n_packs, grid) in enumerate(cases):
        a, b = make_inputs(n_packs, dtype, seed=i)
        guard = 64
        out = torch.full((n_packs * 8 + guard,), 0.5, dtype=dtype, device=DEVICE)
        ref = (a.float() + b.float()).to(dtype)
        g = grid or math.ceil(n_packs / bs)
        kernel.launch(g, {ptrs[0]: a, ptrs[1]: b, ptrs[2]: out, ints[0]: n_packs},
                      stream=stream, mode=mode)
        sync([stream], 30)
        got = out[: n_packs * 8]
        bad = (got.view(torch.int16) != ref.view(torch.int16)).nonzero().flatten()
        if bad.numel():
            j = int(bad[0])
            raise AssertionError(
                f"n_packs={n_packs} grid={g}: {bad.numel()} of {got.numel()} differ; first at "
                f"{j}: a={a[j].item()!r} b={b[j].item()!r} got={got[j].item()!r} "
                f"(0x{int(got.view(torch.int16)[j]) & 0xffff:04x}) want={ref[j].item()!r} "
                f"(0x{int(ref.view(torch.int16)[j]) & 0xffff:04x})")
        if not bool((out[n_packs * 8:] == 0.5).all()):
            raise AssertionError(f"n_packs={n_packs}: wrote past the end")
    return (f"{len(cases)} sizes bit-exact (up to {max(c[0] for c in cases)} packs), mode={mode}, "
            f"attrs={kernel.attributes}")


def builtin_manifest(tmp: Path) -> Path:
    import hashlib
    d = tmp / "sm_90"
    d.mkdir(parents=True, exist_ok=True)
    data = REF_PTX.encode() + b"\0"
    (d / "ref_vector_add.ptx").write_bytes(data)
    args = [{"name": n, "type": t, "offset": o, "size": s} for n, t, o, s in
            (("a", "ptr<bf16>", 0, 8), ("b", "ptr<bf16>", 8, 8), ("out", "ptr<bf16>", 16, 8),
             ("n_packs", "i32", 24, 4))]
    doc = {"arch": "sm_90", "vendor": "nvidia", "wave_size": 32, "fp8_format": "e4m3fn",
           "compiler": {"name": "hand-written PTX"}, "kernels": {"ref_vector_add_bf16": {
               "op": "vector_add", "symbol": "peerdsl_ref_vector_add_bf16",
               "file": "ref_vector_add.ptx", "sha256": hashlib.sha256(data).hexdigest(),
               "constexprs": {"T": "bf16"}, "block_size": 256, "lds_bytes": 0, "args": args,
               "kernarg_size": 28}}}
    (d / "manifest.json").write_text(json.dumps(doc, indent=1))
    return tmp


class Ranks:
    """W ranks of barrier_probe as W streams of this process, sharing one GPU's memory."""

    def __init__(self, W: int, max_grid: int, spin_limit: int):
        self.W = W
        words = layout.SIGNAL_BYTES // 4
        self.sig = [torch.zeros(words, dtype=torch.int32, device=DEVICE) for _ in range(W)]
        for s in self.sig:
            s[layout.SIG_SPIN_LIMIT] = spin_limit   # 0 would make every spin give up at once
        self.slots = [torch.zeros(max_grid, dtype=torch.int32, device=DEVICE) for _ in range(W)]
        self.counter = torch.zeros(1, dtype=torch.int32, device=DEVICE)
        self.out = [torch.zeros(2 * max_grid, dtype=torch.int32, device=DEVICE) for _ in range(W)]
        self.streams = [torch.cuda.Stream() for _ in range(W)]
        self.total = 0  # counter adds so far

    def args(self, r: int, grid: int, stamp: int) -> dict[str, Any]:
        return {"sig": [int(s.data_ptr()) for s in self.sig],
                "slots": [int(s.data_ptr()) for s in self.slots], "counter": self.counter,
                "out": self.out[r], "rank": r, "counter_target": self.total + self.W * grid,
                "stamp": stamp}

    def errors(self) -> list[list[int]]:
        e0, e1 = layout.SIG_ERROR, layout.SIG_ERROR + layout.ERROR_WORDS
        return [s[e0:e1].tolist() for s in self.sig]


def run_barrier(kernel: Any, W: int, rounds: int) -> str:
    grids = [1, 4, 2, 16, 3]
    R = Ranks(W, max(grids), spin_limit=1 << 22)  # ~seconds: far above a us barrier
    torch.cuda.synchronize()
    times = []
    for k in range(1, rounds + 1):
        grid = grids[k % len(grids)]
        for o in R.out:
            o.zero_()
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        for r in range(W):
            kernel.launch(grid, R.args(r, grid, k), stream=R.streams[r])
        sync(R.streams, 60)
        times.append(time.perf_counter() - t0)
        R.total += W * grid
        errs = [e for e in R.errors() if e[0]]
        if errs:
            raise AssertionError(f"round {k} grid {grid}: error records {errs} "
                                 f"(flag, rank, block, what, expected, seen)")
        for r in range(W):
            o = R.out[r][: 2 * grid].view(grid, 2).tolist()
            if any(ok != 1 or seen != W for ok, seen in o):
                raise AssertionError(f"round {k} grid {grid} rank {r}: (ok, seen) per block "
                                     f"{o}, want (1, {W})")
    if int(R.counter.item()) != R.total:
        raise AssertionError(f"counter {int(R.counter.item())} != {R.total}")
    times.sort()
    return (f"W={W}: {rounds} rounds, grids {grids}, every block ok and saw {W} stamps; "
            f"median round {1e6 * times[len(times) // 2]:.0f} us (host-timed, incl. launch)")


def run_timeout(kernel: Any) -> str:
    R = Ranks(2, 1, spin_limit=20_000)
    kernel.launch(1, R.args(0, 1, 1), stream=R.streams[0])  # rank 1 never comes
    sync(R.streams, 60)
    err = R.errors()[0]
    ok, seen = R.out[0][:2].tolist()
    if err[0] != 1 or err[1] != 0 or err[3] != layout.WAIT_FLAG or ok != 0:
        raise AssertionError(f"expected an error record (1, rank 0, block 0, what="
                             f"{layout.WAIT_FLAG}) and ok=0, got record {err}, out ({ok}, {seen})")
    return f"bounded spin expired and recorded {err[:6]} (expected target 2, seen 1)"


def fail(exc: BaseException) -> str:
    raise exc


def no_mlir() -> str:
    bad = [m for m, mod in list(sys.modules.items()) if mod is not None
           and m not in _PRELOADED
           and (m.split(".")[0] in ("mlir", "flydsl") or m.startswith("peerdsl.lowering"))]
    if bad:
        raise AssertionError(f"MLIR/lowering modules got imported: {bad[:5]}")
    return "no MLIR or peerdsl.lowering module imported"


def manifest_checks(man: Any, device: int, rounds: int) -> None:
    loader = pcuda.CudaLoader(man, device=device)
    dtypes = {"bf16": torch.bfloat16, "f16": torch.float16}
    va = [e for e in man.kernels.values() if e.op == "vector_add"]
    if not any(e.constexprs.get("T") == "bf16" for e in va):
        check("vector_add_present", lambda: fail(LookupError(
            f"no bf16 vector_add in the manifest; ops {man.ops()}")))
    for e in va:
        T = e.constexprs.get("T")
        for mode in ("params", "buffer") if T in dtypes else ():
            check(f"vector_add[{T},{mode}]",
                  lambda: run_vector_add(loader.load(e), e, dtypes[T], mode))
    bp = sorted((e for e in man.kernels.values() if e.op == "barrier_probe"),
                key=lambda e: int(e.constexprs.get("W", 0)))
    if not bp:
        check("barrier_probe_present", lambda: fail(LookupError(
            f"no barrier_probe in the manifest; ops {man.ops()}")))
    for e in bp:
        W = int(e.constexprs["W"])
        check(f"barrier_probe[W={W}]", lambda: run_barrier(loader.load(e), W, rounds))
    two = [e for e in bp if int(e.constexprs.get("W", 0)) == 2]
    if two:
        check("barrier_timeout", lambda: run_timeout(loader.load(two[0])))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--manifest", default=os.environ.get("PEERDSL_MANIFEST_DIR", "build"),
                    help="build dir holding sm_90/manifest.json (default: ./build)")
    ap.add_argument("--device", type=int, default=0)
    ap.add_argument("--rounds", type=int, default=20)
    ap.add_argument("--no-builtin", action="store_true", help="skip the hand-written PTX check")
    ap.add_argument("--no-ipc", action="store_true",
                    help="skip the two-process CUDA IPC and VMM-fd checks")
    a = ap.parse_args()
    env: dict[str, Any] = {"python": sys.version.split()[0], "torch": torch.__version__,
                           "manifest": str(Path(a.manifest).resolve())}

    def environment() -> str:
        if not torch.cuda.is_available():
            raise RuntimeError("torch sees no CUDA GPU")
        torch.cuda.set_device(a.device)
        import cuda.bindings
        from cuda.bindings import driver as drv
        env.update(gpu=torch.cuda.get_device_name(a.device),
                   capability=list(torch.cuda.get_device_capability(a.device)),
                   cuda_driver=pcuda.check(drv.cuDriverGetVersion(), "cuDriverGetVersion"),
                   cuda_bindings=getattr(cuda.bindings, "__version__", "?"))
        return json.dumps(env)

    if not check("environment", environment):
        return finish(env)

    if not a.no_builtin:
        with tempfile.TemporaryDirectory() as tmp:
            man = load_manifest(builtin_manifest(Path(tmp)), "sm_90")
            e = man.find("vector_add", T="bf16")
            for mode in ("params", "buffer"):
                loader = pcuda.CudaLoader(man, device=a.device, mode=mode)
                check(f"builtin_vector_add[{mode}]",
                      lambda: run_vector_add(loader.load(e), e, torch.bfloat16, mode))

    if not a.no_ipc:
        from peerdsl.runtime.cuda import selftest
        check("ipc_2proc", lambda: selftest.run_ipc_selftest(a.device))
        check("vmm_fd_2proc", lambda: selftest.run_vmm_selftest(a.device))

    man = None
    try:
        man = load_manifest(a.manifest, "sm_90")
        check("load_manifest", lambda: f"{len(man.kernels)} kernels, sha256 + ELF headers "
              f"checked; ops {man.ops()}; compiler {man.compiler}")
    except Exception as e:
        check("load_manifest", lambda e=e: fail(e))
    if man is not None:
        manifest_checks(man, a.device, a.rounds)
    check("no_mlir", no_mlir)

    return finish(env)


def finish(env: dict[str, Any]) -> int:
    passed = sum(r["ok"] for r in RESULTS)
    summary = f"{passed} passed, {len(RESULTS) - passed} failed"
    print(("PASS" if passed == len(RESULTS) else "FAIL") + f": {summary}", flush=True)
    out = os.environ.get("OUT")
    if out:
        Path(out).mkdir(parents=True, exist_ok=True)
        (Path(out) / "loader_proof.json").write_text(json.dumps(
            {"env": env, "checks": RESULTS, "summary": summary,
             "ok": passed == len(RESULTS)}, indent=1))
    return 0 if passed == len(RESULTS) else 1


if __name__ == "__main__":
    rc = main()
    sys.stdout.flush()
    # A hung kernel would block interpreter shutdown; the JSON is already written.
    os._exit(rc)
