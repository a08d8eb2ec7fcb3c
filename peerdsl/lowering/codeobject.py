"""Metadata read back from the code objects themselves (not from what we asked for).

AMD: the ELF header's e_flags (mach) and the NT_AMDGPU_METADATA note (msgpack) give
registers, LDS, scratch, spills and the kernarg layout. NVIDIA: `ptxas -v` reports the
registers, spills and stack; the parameter layout is the natural-alignment layout of the
kernel's parameters, which is what PTX `.param` space uses.
"""
from __future__ import annotations

import dataclasses
import io
import re
import struct
from typing import Any

import msgpack
from elftools.elf.elffile import ELFFile

from ..dsl import ir
from .errors import CompileError

NT_AMDGPU_METADATA = 32
EF_AMDGPU_MACH = 0xFF


@dataclasses.dataclass
class AmdKernelInfo:
    mach: int
    e_flags: int
    resources: dict[str, int]
    kernarg_size: int
    lds_bytes: int
    wave_size: int
    args: list[dict[str, Any]]     # explicit args: offset, size, value_kind
    metadata: dict[str, Any]


def amd_metadata(data: bytes) -> tuple[int, dict[str, Any]]:
    """(e_flags, decoded NT_AMDGPU_METADATA map) of an AMDGPU code object."""
    elf = ELFFile(io.BytesIO(data))
    e_flags = elf.header["e_flags"]
    for section in elf.iter_sections():
        if section.header["sh_type"] != "SHT_NOTE":
            continue
        for note in section.iter_notes():
            if note["n_name"] == "AMDGPU" and note["n_type"] in (NT_AMDGPU_METADATA,
                                                                  "NT_AMDGPU_METADATA"):
                desc = note["n_desc"]
                raw = desc if isinstance(desc, bytes) else bytes(desc, "latin-1")
                return e_flags, msgpack.unpackb(raw, raw=False, strict_map_key=False)
    raise CompileError("code object has no NT_AMDGPU_METADATA note")


def read_amd(data: bytes, symbol: str) -> AmdKernelInfo:
    e_flags, meta = amd_metadata(data)
    kernels = {k.get(".name"): k for k in meta.get("amdhsa.kernels", [])}
    if symbol not in kernels:
        raise CompileError(f"kernel {symbol!r} not in code object (has {sorted(kernels)})")
    k = kernels[symbol]
    res = {"vgpr": k.get(".vgpr_count", 0), "sgpr": k.get(".sgpr_count", 0),
           "agpr": k.get(".agpr_count", 0),
           "scratch_bytes": k.get(".private_segment_fixed_size", 0),
           "vgpr_spill": k.get(".vgpr_spill_count", 0),
           "sgpr_spill": k.get(".sgpr_spill_count", 0)}
    args = [a for a in k.get(".args", [])
            if not str(a.get(".value_kind", "")).startswith("hidden_")]
    return AmdKernelInfo(e_flags & EF_AMDGPU_MACH, e_flags, res,
                         k.get(".kernarg_segment_size", 0),
                         k.get(".group_segment_fixed_size", 0),
                         k.get(".wavefront_size", 0),
                         [{"offset": a.get(".offset"), "size": a.get(".size"),
                           "value_kind": a.get(".value_kind")} for a in args], k)


def name_args(kernel: ir.Kernel, meta_args: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Our parameter names and types with the offsets/sizes the code object declares."""
    if len(meta_args) != len(kernel.params):
        raise CompileError(f"{kernel.name}: code object declares {len(meta_args)} args, the "
                           f"kernel has {len(kernel.params)} parameters")
    out = []
    for p, a in zip(kernel.params, meta_args):
        if a["size"] != _param_size(p.type):
            raise CompileError(f"{kernel.name}: arg {p.name} is {a['size']} bytes in the code "
                               f"object, expected {_param_size(p.type)}")
        out.append({"name": p.name, "type": _param_type(p.type), "offset": a["offset"],
                    "size": a["size"], **_role(p)})
    return out


def _role(p: ir.Param) -> dict[str, str]:
    """{"role": "call_id"} for a parameter the runtime fills (dsl.CallId), else nothing."""
    return {"role": p.role} if getattr(p, "role", "") else {}


def _param_size(t: Any) -> int:
    return 8 if isinstance(t, ir.PtrType) else t.nbytes


def _param_type(t: Any) -> str:
    return f"ptr<{t.elem}>" if isinstance(t, ir.PtrType) else t.name


def nvidia_params(kernel: ir.Kernel) -> tuple[list[dict[str, Any]], int]:
    """Param layout: each parameter at its natural alignment, in order (PTX .param rules)."""
    off, out = 0, []
    for p in kernel.params:
        size = _param_size(p.type)
        off = (off + size - 1) // size * size
        out.append({"name": p.name, "type": _param_type(p.type), "offset": off, "size": size,
                    **_role(p)})
        off += size
    return out, off


_PTXAS_NUM = {"registers": r"Used (\d+) registers", "spill_stores": r"(\d+) bytes spill stores",
              "spill_loads": r"(\d+) bytes spill loads", "stack_bytes": r"(\d+) bytes stack frame",
              "smem_bytes": r"(\d+) bytes smem", "barriers": r"used (\d+) barriers"}


def parse_ptxas_log(log: str, symbol: str) -> dict[str, int]:
    """Resources of `symbol` from `ptxas -v` output (the block after its 'Compiling' line)."""
    m = re.search(rf"(?:Compiling entry function|Function properties for) '?{re.escape(symbol)}'?"
                  r"(.*?)(?=Compiling entry function|\Z)", log, re.S)
    if not m:
        raise CompileError(f"ptxas -v output has no report for {symbol}:\n{log}")
    block = m.group(0)
    res = {}
    for key, pat in _PTXAS_NUM.items():
        hit = re.search(pat, block)
        res[key] = int(hit.group(1)) if hit else 0
    return res


EIATTR_KPARAM_INFO, EIATTR_CBANK_PARAM_SIZE = 0x17, 0x19


def cubin_params(data: bytes, symbol: str) -> tuple[list[tuple[int, int, int]], int]:
    """([(ordinal, offset, size)] in ordinal order, total param bytes) from the cubin's
    .nv.info.<symbol> section: the layout the driver really uses."""
    elf = ELFFile(io.BytesIO(data))
    sec = elf.get_section_by_name(f".nv.info.{symbol}")
    if sec is None:
        raise CompileError(f"cubin has no .nv.info.{symbol} section")
    d, i, params, total = sec.data(), 0, [], -1
    while i + 2 <= len(d):
        fmt, attr = d[i], d[i + 1]
        if fmt == 4:  # EIFMT_SVAL: u16 size, then the value
            size = struct.unpack_from("<H", d, i + 2)[0]
            val = d[i + 4:i + 4 + size]
            i += 4 + size
            if attr == EIATTR_KPARAM_INFO:
                _index, ordinal, offset, bits = struct.unpack_from("<IHHI", val)
                params.append((ordinal, offset, (bits >> 18) & 0x3FFF))
        elif fmt in (2, 3):  # EIFMT_BVAL / EIFMT_HVAL: value in the next 2 bytes
            if attr == EIATTR_CBANK_PARAM_SIZE:
                total = struct.unpack_from("<H", d, i + 2)[0]
            i += 4
        else:
            i += 2
    return sorted(params), total


def check_cubin_params(data: bytes, symbol: str, args: list[dict[str, Any]], size: int) -> None:
    """The computed layout must be the one ptxas recorded (else launches would corrupt args)."""
    params, total = cubin_params(data, symbol)
    want = [(i, a["offset"], a["size"]) for i, a in enumerate(args)]
    if params != want or (total >= 0 and total != size):
        raise CompileError(f"{symbol}: cubin parameter layout {params} (total {total}) differs "
                           f"from the computed {want} (total {size})")


def cubin_info(data: bytes) -> dict[str, Any]:
    """ELF facts of a cubin: e_flags (its low bits hold the SM) and the symbols in .text."""
    elf = ELFFile(io.BytesIO(data))
    return {"e_machine": elf.header["e_machine"], "e_flags": elf.header["e_flags"],
            "sections": [s.name for s in elf.iter_sections()]}
