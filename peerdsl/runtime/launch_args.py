"""A user launch's arguments checked against the kernel's signature, the same on every backend.

The GPU communicator takes the signature from the kernel's manifest entry, the simulator from
the DSL kernel and its trace (kernel_signature.py); both then call `check_args` and
`check_grid`, so a wrong launch fails the same way everywhere, before anything runs, with an
error that names the argument, what it got and what the kernel declares.
"""
from __future__ import annotations

import math
import operator
from collections.abc import Mapping
from typing import Any

from .kernarg import KernargError, TORCH_DTYPES
from .kernel_signature import (DECLARED, PACK_BYTES, Param, Signature, annotate_args,
                               pointer_alignment, signature_from_entry, signature_from_kernel)
from .peer_buffers import PeerBuffer

__all__ = ["LaunchArgError", "check_args", "check_grid", "describe",
           # the signatures the checks read (kernel_signature.py)
           "Param", "Signature", "signature_from_entry", "signature_from_kernel",
           "annotate_args", "pointer_alignment"]

_F32_MAX = 3.4028234663852886e38
_INT_RANGE = {"i32": (-(1 << 31), (1 << 31) - 1), "i64": (-(1 << 63), (1 << 63) - 1)}


class LaunchArgError(KernargError, TypeError):
    """A launch argument does not fit the kernel's signature (or the grid its limits)."""


# ---------------------------------------------------------------------- checks
def describe(v: Any) -> str:
    """A value as an error message shows it."""
    if _is_tensor(v):
        return (f"a {str(v.dtype).replace('torch.', '')} tensor of shape {tuple(v.shape)} on "
                f"{v.device}")
    if isinstance(v, PeerBuffer):
        return repr(v)
    if isinstance(v, (list, tuple)):
        return f"a {type(v).__name__} of {len(v)} values"
    if isinstance(v, (bool, int, float, str)):
        return f"{type(v).__name__} {v!r}"
    return f"a {type(v).__name__}"


def _is_tensor(v: Any) -> bool:
    return type(v).__module__.split(".")[0] == "torch" and hasattr(v, "data_ptr")


def check_args(sig: Signature, args: Mapping[str, Any], implicit: Mapping[str, Any], *,
               device: Any, sim: bool = False) -> dict[str, Any]:
    """Check the user's `args` against `sig` and return them merged with the runtime-filled
    `implicit` ones (scalars normalized to int/float). `device`: where tensors must be (a
    torch.device); `sim`: the simulator, whose tensors are CPU tensors. Raises one
    LaunchArgError listing every problem."""
    names = [p.name for p in sig.params]
    runtime = set(sig.runtime_filled)
    passed_runtime = sorted(runtime & set(args))
    missing = [n for n in names if n not in args and n not in runtime]
    unknown = sorted(set(args) - set(names))
    if missing or unknown or passed_runtime:
        parts = []
        if missing:
            parts.append(f"missing arguments {missing}")
        if unknown:
            parts.append(f"unknown arguments {unknown}")
        if passed_runtime:
            parts.append(f"{passed_runtime} are filled by the runtime: do not pass them")
        expects = ", ".join(f"{p.name}: {p.declared}" for p in sig.params if p.name not in runtime)
        raise LaunchArgError(f"{sig.kernel}: {'; '.join(parts)} (the kernel takes {expects})")
    merged = {**args, **implicit}
    problems, out = [], {}
    for p in sig.params:
        if p.name not in merged:
            problems.append(f"argument {p.name!r} is filled by the runtime, which gave no value "
                            "(no call identity hook yet)")
            continue
        v = merged[p.name]
        try:
            out[p.name] = _check_one(p, v, device, sim)
        except LaunchArgError as e:
            problems.append(f"argument {p.name!r} got {describe(v)}; the kernel declares "
                            f"{p.declared}: {e}")
    if problems:
        raise LaunchArgError(f"{sig.kernel}: " + "\n  ".join(problems))
    return out


def _check_one(p: Param, v: Any, device: Any, sim: bool) -> Any:
    if p.kind in ("scalar", "call_id"):
        return _scalar(p, v)
    if p.kind == "peer_ptrs":
        if isinstance(v, PeerBuffer):
            _dtype(p, v.dtype)
            entries = list(v.addresses)
        elif isinstance(v, (list, tuple)):
            entries = [_address(p, a) for a in v]
        elif _is_tensor(v):
            raise LaunchArgError("a PeerPtrs parameter takes every rank's address: pass "
                                 "comm.register(tensor) (collective) or comm.peer_buffer(shape, "
                                 "dtype)")
        else:
            raise LaunchArgError("pass a PeerBuffer (comm.register / comm.peer_buffer / "
                                 "comm.signal) or a list of addresses")
        if not 1 <= len(entries) <= p.peers:
            raise LaunchArgError(f"a table of 1..{p.peers} addresses, got {len(entries)}")
        for a in entries:
            _aligned(p, a)
        return v
    if v is None and p.kind == "ptr":
        return None  # an explicit null (optional buffers)
    if _is_tensor(v):
        _tensor(p, v, device, sim)
        return v
    if isinstance(v, PeerBuffer):
        _dtype(p, v.dtype)
        return v
    if isinstance(v, (list, tuple)):
        raise LaunchArgError(f"a {DECLARED[p.kind]} takes one buffer; a list of addresses is "
                             "for PeerPtrs")
    addr = _address(p, v)
    if p.kind == "ptr":
        _aligned(p, addr)
    elif addr % 8:
        raise LaunchArgError(f"a table address must be 8-byte aligned, got {addr:#x}")
    return addr


def _scalar(p: Param, v: Any) -> int | float:
    if _is_tensor(v):
        raise LaunchArgError("pass a Python number (t.item()), not a tensor")
    if isinstance(v, bool) or type(v).__name__ in ("bool_", "bool"):  # numpy's too
        raise LaunchArgError(f"a bool is not a {p.dtype}: pass int({v!r})")
    if p.dtype in _INT_RANGE:
        try:
            iv = operator.index(v)
        except TypeError:
            hint = f" (int({v!r}) truncates)" if isinstance(v, float) else ""
            raise LaunchArgError(f"{p.dtype} needs an int{hint}") from None
        lo, hi = _INT_RANGE[p.dtype]
        if not lo <= iv <= hi:
            raise LaunchArgError(f"{iv} is out of range for {p.dtype} [{lo}, {hi}]")
        return iv
    if isinstance(v, str):
        raise LaunchArgError(f"{p.dtype} needs a number")
    try:
        fv = float(v)
    except (TypeError, ValueError):
        raise LaunchArgError(f"{p.dtype} needs a number") from None
    if math.isfinite(fv) and abs(fv) > _F32_MAX:
        raise LaunchArgError(f"{fv!r} overflows f32")
    return fv


def _dtype(p: Param, dtype: Any) -> None:
    name = str(dtype).replace("torch.", "")
    if p.dtype and name not in TORCH_DTYPES.get(p.dtype, set()):
        raise LaunchArgError(f"its dtype {name} is not the declared element {p.dtype} "
                             f"(accepts {sorted(TORCH_DTYPES.get(p.dtype, ()))})")


def _tensor(p: Param, t: Any, device: Any, sim: bool) -> None:
    if sim:
        if t.device.type != "cpu":
            raise LaunchArgError("on the simulator pass CPU tensors (results are copied back "
                                 "into them)")
    elif t.device.type != device.type or (t.device.index is not None and device.index
                                          is not None and t.device.index != device.index):
        raise LaunchArgError(f"the tensor is on {t.device}; this communicator runs on {device}")
    _dtype(p, t.dtype)
    if not t.is_contiguous():
        raise LaunchArgError(f"not contiguous (strides {t.stride()}): pass t.contiguous()")
    _aligned(p, t.data_ptr(), "its data starts at")


def _address(p: Param, v: Any) -> int:
    if isinstance(v, (bool, float)):
        raise LaunchArgError("not an address")
    try:
        addr = operator.index(v)
    except TypeError:
        raise LaunchArgError("expected a tensor, a PeerBuffer or an int address") from None
    if not 0 <= addr < (1 << 64):
        raise LaunchArgError(f"{addr:#x} is not a 64-bit address")
    return addr


def _aligned(p: Param, addr: int, what: str = "address") -> None:
    if addr % p.align:
        why = " (the kernel accesses 16-byte packs through it)" if p.align == PACK_BYTES else ""
        raise LaunchArgError(f"{what} {addr:#x}, not {p.align}-byte aligned{why}")


def check_grid(sig: Signature, grid: Any, cap: int | None) -> int:
    """The grid as an int, checked: positive, and for a kernel that synchronizes at most
    `cap` blocks (every block of every rank must be resident at once)."""
    if isinstance(grid, bool) or isinstance(grid, float):
        raise LaunchArgError(f"{sig.kernel}: grid must be a positive int, got {describe(grid)}")
    try:
        g = operator.index(grid)
    except TypeError:
        raise LaunchArgError(f"{sig.kernel}: grid must be a positive int (the DSL's block_id "
                             f"is one-dimensional), got {describe(grid)}") from None
    if g < 1 or g >= 1 << 31:
        raise LaunchArgError(f"{sig.kernel}: grid {g} is not in [1, 2^31)")
    if cap is not None and sig.synchronizes and g > cap:
        raise LaunchArgError(
            f"{sig.kernel}: grid {g} exceeds {cap}, the blocks that can be resident at once "
            "here; a kernel that synchronizes with its peers needs every block of every rank "
            f"running together: launch at most {cap} blocks (a grid-stride loop covers the rest)")
    return g
