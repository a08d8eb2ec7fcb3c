"""Load and validate a kernel manifest (DIR/<arch>/manifest.json) without MLIR.

The ahead-of-time build writes one manifest per target; the runtime reads it here, checks
every code object against its recorded sha256 and ELF header (so a stale or wrong-target
file fails at load with a clear message rather than as a launch fault), finds a kernel by
op + constexprs and packs its arguments through the entry's `PackPlan` (packplan.py, the one
packing implementation).
"""
from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import struct
from pathlib import Path
from typing import Any, Mapping

from .kernarg import ArgSpec, KernargError, arg_specs_from_json, peer_tables, validate_layout
from .packplan import PackPlan, pack_kernargs

__all__ = ["KNOWN_ARCHS", "ManifestError", "KernelEntry", "Manifest", "load_manifest",
           "constexpr_json", "pack_kernargs", "KernargError"]

# arch -> (vendor, wave size, fp8 format); SPEC section 1 and 2.4.
KNOWN_ARCHS: dict[str, tuple[str, int, str]] = {
    "sm_90": ("nvidia", 32, "e4m3fn"),
    "gfx1250": ("amd", 32, "e4m3fn"),
    "gfx950": ("amd", 64, "e4m3fn"),
    "gfx942": ("amd", 64, "e4m3fnuz"),
}
_AMD_MACH = {"gfx1250": 0x49, "gfx950": 0x4F, "gfx942": 0x4C}  # ELF e_flags & 0xff
_EM_CUDA, _EM_AMDGPU = 190, 224
_REQUIRED = ("op", "symbol", "file", "sha256", "args", "kernarg_size", "block_size")


_PLANS: dict[str, tuple[Any, PackPlan]] = {}  # instance name -> (its args, compiled plan)


class ManifestError(Exception):
    """The manifest or one of its code objects is missing, malformed or does not match."""


@dataclasses.dataclass(frozen=True)
class KernelEntry:
    name: str                      # instance name (the manifest key)
    op: str
    symbol: str
    path: Path                     # absolute path of the code object
    sha256: str
    constexprs: dict[str, Any]
    block_size: int
    lds_bytes: int                 # static shared memory the kernel declares
    dynamic_lds_bytes: int         # shared memory to request at launch (0 unless recorded)
    args: tuple[ArgSpec, ...]
    kernarg_size: int
    resources: dict[str, Any]
    cache_key: str
    raw: dict[str, Any] = dataclasses.field(repr=False, compare=False)

    def code_object(self) -> bytes:
        """The code object's bytes, re-checked against sha256 (the file may change on disk)."""
        data = _read(self.path, self.name)
        _check_sha(data, self.sha256, self.path, self.name)
        return data

    @property
    def arg_names(self) -> list[str]:
        return [a.name for a in self.args]

    @property
    def peer_tables(self) -> dict[str, list[str]]:
        return peer_tables(self.args)

    def pack(self, args: Mapping[str, Any], *, device: int | None = None) -> bytes:
        """The kernargs for `args`, every argument checked (PackPlan.pack_checked)."""
        return self.pack_plan().pack_checked(args, device=device)

    def pack_trusted(self, args: Mapping[str, Any]) -> bytes:
        """`pack` without the per-argument checks, for callers that checked their inputs."""
        return self.pack_plan().pack(args)

    def pack_plan(self) -> PackPlan:
        """This entry's compiled layout, built once per instance (the loaders fill their
        preallocated launch buffers with it)."""
        plan = _PLANS.get(self.name)
        if plan is None or plan[0] is not self.args:
            plan = _PLANS[self.name] = (self.args, PackPlan(self.args, self.kernarg_size,
                                                            self.name))
        return plan[1]


@dataclasses.dataclass(frozen=True)
class Manifest:
    path: Path
    arch: str
    vendor: str
    wave_size: int
    fp8_format: str
    compiler: dict[str, Any]
    kernels: dict[str, KernelEntry]

    def ops(self) -> list[str]:
        return sorted({k.op for k in self.kernels.values()})

    def find(self, op: str, constexprs: Mapping[str, Any] | None = None,
             **kw: Any) -> KernelEntry:
        """The one kernel of `op` whose constexprs match (compared by their JSON names).

        The query may name a subset of the constexprs; it must then pick exactly one entry.
        """
        query = {k: constexpr_json(v) for k, v in {**(constexprs or {}), **kw}.items()}
        cands = [k for k in self.kernels.values() if k.op == op]
        if not cands:
            raise ManifestError(f"no kernel for op {op!r} in {self.path} ({self.arch}); "
                                f"ops: {self.ops()}")
        known = set().union(*(c.constexprs for c in cands))
        bad = sorted(set(query) - known)
        if bad:
            raise ManifestError(f"op {op!r} has no constexpr {bad}; it has {sorted(known)}")
        hits = [c for c in cands if all(k in c.constexprs and _same(c.constexprs[k], v)
                                        for k, v in query.items())]
        if len(hits) == 1:
            return hits[0]
        have = [c.constexprs for c in cands]
        if not hits:
            raise ManifestError(f"no {op!r} kernel with constexprs {query} in {self.arch}; "
                                f"built variants: {have}")
        raise ManifestError(f"constexprs {query} match {len(hits)} {op!r} kernels "
                            f"({[h.name for h in hits]}); name more of {sorted(known)}")

    def get(self, name: str) -> KernelEntry:
        try:
            return self.kernels[name]
        except KeyError:
            raise ManifestError(f"no kernel instance {name!r} in {self.path}; instances: "
                                f"{sorted(self.kernels)}") from None


def constexpr_json(v: Any) -> Any:
    """The JSON form of a constexpr value: dtypes by their short names (bf16, f16, f32 ...)."""
    if v is None or isinstance(v, (bool, int, float, str)):
        return v
    mod = type(v).__module__.split(".")[0]
    if mod == "torch" and type(v).__name__ == "dtype":
        name = str(v).replace("torch.", "")
        return {"bfloat16": "bf16", "float16": "f16", "float32": "f32", "float64": "f64",
                "int8": "i8", "int16": "i16", "int32": "i32", "int64": "i64",
                "bool": "i1"}.get(name, name)
    if isinstance(v, (list, tuple)):
        return [constexpr_json(x) for x in v]
    if isinstance(v, Mapping):
        return {str(k): constexpr_json(x) for k, x in v.items()}
    name = getattr(v, "name", None)  # DSL scalar types (ir.ScalarType) and enums
    if isinstance(name, str):
        return name
    return str(v)


def _same(a: Any, b: Any) -> bool:
    return json.dumps(a, sort_keys=True) == json.dumps(b, sort_keys=True)


def _read(path: Path, what: str) -> bytes:
    try:
        return path.read_bytes()
    except FileNotFoundError:
        raise ManifestError(f"kernel {what}: code object file missing: {path}") from None


def _check_sha(data: bytes, want: str, path: Path, what: str) -> None:
    got = hashlib.sha256(data).hexdigest()
    if got != want.lower():
        raise ManifestError(f"kernel {what}: sha256 mismatch for {path}: manifest says "
                            f"{want}, file has {got} (stale build? rebuild the manifest)")


def check_code_object(data: bytes, arch: str, what: str = "") -> None:
    """Static header check: ELF for the right machine (AMD: the right gfx in e_flags)."""
    vendor = KNOWN_ARCHS[arch][0]
    pre = f"kernel {what}: " if what else ""
    if vendor == "nvidia" and (data.startswith(b"//") or data.lstrip().startswith(b".version")
                               or data[:4] == b"\x50\xed\x55\xba"):
        return  # PTX text (JIT-compiled by the driver) or a fatbin
    if data[:4] != b"\x7fELF" or len(data) < 64 or data[4] != 2:
        raise ManifestError(f"{pre}code object is not a 64-bit ELF file")
    e_machine = struct.unpack_from("<H", data, 18)[0]
    want = _EM_CUDA if vendor == "nvidia" else _EM_AMDGPU
    if e_machine != want:
        raise ManifestError(f"{pre}ELF e_machine {e_machine}, expected {want} for {arch}")
    if vendor == "amd":
        mach = struct.unpack_from("<I", data, 48)[0] & 0xFF
        if mach != _AMD_MACH[arch]:
            names = {v: k for k, v in _AMD_MACH.items()}
            raise ManifestError(f"{pre}code object is for {names.get(mach, hex(mach))}, "
                                f"manifest says {arch}")


def _resolve(path: str | os.PathLike, arch: str | None) -> Path:
    p = Path(path)
    if p.is_file():
        return p
    if not p.exists():
        raise ManifestError(f"manifest path does not exist: {p}")
    if (p / "manifest.json").is_file():
        return p / "manifest.json"
    if arch is not None:
        if arch not in KNOWN_ARCHS:
            raise ManifestError(f"unknown arch {arch!r}; known: {sorted(KNOWN_ARCHS)}")
        q = p / arch / "manifest.json"
        if not q.is_file():
            raise ManifestError(f"no manifest for {arch} under {p} (expected {q})")
        return q
    found = sorted(d.name for d in p.iterdir() if (d / "manifest.json").is_file())
    if len(found) != 1:
        raise ManifestError(f"{p} holds manifests for {found or 'no arch'}; pass arch=")
    return p / found[0] / "manifest.json"


def _entry(name: str, k: Mapping[str, Any], base: Path, arch: str, verify: bool) -> KernelEntry:
    missing = [f for f in _REQUIRED if f not in k]
    if missing:
        raise ManifestError(f"kernel {name}: manifest entry lacks {missing}")
    try:
        args = arg_specs_from_json(k["args"])
        validate_layout(args, int(k["kernarg_size"]), where=f"kernel {name}")
    except KernargError as e:
        raise ManifestError(str(e)) from None
    res = dict(k.get("resources") or {})
    entry = KernelEntry(
        name=name, op=str(k["op"]), symbol=str(k["symbol"]), path=(base / k["file"]).resolve(),
        sha256=str(k["sha256"]), constexprs=dict(k.get("constexprs") or {}),
        block_size=int(k["block_size"]), lds_bytes=int(k.get("lds_bytes", 0)),
        dynamic_lds_bytes=int(k.get("dynamic_lds_bytes", res.get("dynamic_lds_bytes", 0))),
        args=args, kernarg_size=int(k["kernarg_size"]), resources=res,
        cache_key=str(k.get("cache_key", "")), raw=dict(k))
    if not 1 <= entry.block_size <= 1024:
        raise ManifestError(f"kernel {name}: block_size {entry.block_size} out of [1, 1024]")
    if verify:
        data = _read(entry.path, name)
        _check_sha(data, entry.sha256, entry.path, name)
        check_code_object(data, arch, name)
    return entry


def load_manifest(path: str | os.PathLike, arch: str | None = None, *,
                  verify: bool = True) -> Manifest:
    """Load DIR/<arch>/manifest.json (or DIR/manifest.json, or the file itself).

    verify=True reads every code object and checks sha256 + ELF header now.
    """
    mpath = _resolve(path, arch)
    try:
        doc = json.loads(mpath.read_text())
    except json.JSONDecodeError as e:
        raise ManifestError(f"{mpath} is not valid JSON: {e}") from None
    if not isinstance(doc, dict):
        raise ManifestError(f"{mpath}: top level must be an object")
    march = doc.get("arch")
    if march not in KNOWN_ARCHS:
        raise ManifestError(f"{mpath}: unknown arch {march!r}; known: {sorted(KNOWN_ARCHS)}")
    if arch is not None and march != arch:
        raise ManifestError(f"{mpath} is for {march}, asked for {arch}")
    vendor, wave, fp8 = KNOWN_ARCHS[march]
    for key, want in (("vendor", vendor), ("wave_size", wave), ("fp8_format", fp8)):
        if key in doc and doc[key] != want:
            raise ManifestError(f"{mpath}: {key} {doc[key]!r} is wrong for {march} "
                                f"(expected {want!r})")
    kernels = doc.get("kernels")
    if not isinstance(kernels, dict):
        raise ManifestError(f"{mpath}: 'kernels' must be an object of instance -> entry")
    base = mpath.parent
    entries = {n: _entry(n, k, base, march, verify) for n, k in kernels.items()}
    return Manifest(path=mpath, arch=march, vendor=vendor, wave_size=wave, fp8_format=fp8,
                    compiler=dict(doc.get("compiler") or {}), kernels=entries)
