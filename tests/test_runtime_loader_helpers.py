"""Helpers (no tests) shared by the runtime loader tests: fake code objects and manifests."""
from __future__ import annotations

import hashlib
import json
import struct
from pathlib import Path
from typing import Any

EM_CUDA, EM_AMDGPU = 190, 224
MACH = {"gfx1250": 0x49, "gfx950": 0x4F, "gfx942": 0x4C}
VENDOR = {"sm_90": "nvidia", "gfx1250": "amd", "gfx950": "amd", "gfx942": "amd"}
WAVE = {"sm_90": 32, "gfx1250": 32, "gfx950": 64, "gfx942": 64}
FP8 = {"sm_90": "e4m3fn", "gfx1250": "e4m3fn", "gfx950": "e4m3fn", "gfx942": "e4m3fnuz"}


def fake_elf(arch: str, tag: bytes = b"") -> bytes:
    """A 64-byte ELF64 header with the right e_machine (and gfx mach bits) plus a tag."""
    hdr = bytearray(64)
    hdr[:4] = b"\x7fELF"
    hdr[4], hdr[5], hdr[6] = 2, 1, 1
    struct.pack_into("<H", hdr, 18, EM_CUDA if VENDOR[arch] == "nvidia" else EM_AMDGPU)
    struct.pack_into("<I", hdr, 48, 0x400 | MACH.get(arch, 90))
    return bytes(hdr) + tag


VECTOR_ADD_ARGS = [
    {"name": "a", "type": "ptr<bf16>", "offset": 0, "size": 8},
    {"name": "b", "type": "ptr<bf16>", "offset": 8, "size": 8},
    {"name": "out", "type": "ptr<bf16>", "offset": 16, "size": 8},
    {"name": "n", "type": "i32", "offset": 24, "size": 4},
]
PEER_ARGS = ([{"name": f"sig_{i}", "type": "ptr<i32,global>", "offset": 8 * i, "size": 8}
              for i in range(8)]
             + [{"name": "rank", "type": "i32", "offset": 64, "size": 4},
                {"name": "world", "type": "i32", "offset": 68, "size": 4},
                {"name": "epoch", "type": "i64", "offset": 72, "size": 8},
                {"name": "scale", "type": "f32", "offset": 80, "size": 4}])


def kernel_entry(name: str, op: str, args: list[dict[str, Any]], kernarg_size: int,
                 constexprs: dict[str, Any], data: bytes, ext: str, **extra: Any) -> dict:
    return {"op": op, "symbol": name, "file": f"{name}.{ext}",
            "sha256": hashlib.sha256(data).hexdigest(), "isa_file": f"{name}.s",
            "constexprs": constexprs, "block_size": 256, "lds_bytes": 0, "args": args,
            "kernarg_size": kernarg_size, "resources": {}, "cache_key": "k-" + name, **extra}


def write_manifest(root: Path, arch: str = "sm_90", kernels: dict | None = None,
                   **top: Any) -> Path:
    """DIR/<arch>/manifest.json with vector_add (bf16, f16) and a peer-table kernel."""
    d = root / arch
    d.mkdir(parents=True, exist_ok=True)
    ext = "cubin" if VENDOR[arch] == "nvidia" else "hsaco"
    if kernels is None:
        kernels = {}
        for name, op, args, size, cx in (
                ("vector_add_bf16", "vector_add", VECTOR_ADD_ARGS, 28, {"T": "bf16"}),
                ("vector_add_f16", "vector_add", VECTOR_ADD_ARGS, 28, {"T": "f16"}),
                ("peer_probe_w8", "peer_probe", PEER_ARGS, 88, {"WORLD": 8, "T": "bf16"})):
            data = fake_elf(arch, name.encode())
            (d / f"{name}.{ext}").write_bytes(data)
            kernels[name] = kernel_entry(name, op, args, size, cx, data, ext)
    doc = {"arch": arch, "vendor": VENDOR[arch], "wave_size": WAVE[arch],
           "fp8_format": FP8[arch], "compiler": {"name": "test"}, "kernels": kernels, **top}
    (d / "manifest.json").write_text(json.dumps(doc, indent=1))
    return d / "manifest.json"


class FakeGpuTensor:
    """Duck-types what pack_kernargs reads from a torch GPU tensor (CPU-only torch here)."""
    __module__ = "torch.fake"

    def __init__(self, dtype: Any, addr: int = 0x7F0000001000, index: int = 0):
        import torch
        self.dtype = dtype
        self.device = torch.device("cuda", index)
        self._addr = addr

    def data_ptr(self) -> int:
        return self._addr
