"""Call identity and the rule after an error (issue 14; docs/RELIABILITY.md).

Every collective entry point takes the communicator's next sequence number when it is
entered, before any input check, so a rank whose call failed its checks has still used its
number and its next call cannot pass for the one it skipped. At launch the runtime fills the
kernel's `dsl.CallId` parameter with the call's 31-bit tag:

    code = crc32(op, the entry's dtypes/shapes/options, kernel, constexprs, world)
    tag  = (seq * 0x9E3779B1 ^ code) & 0x7FFFFFFF

Equal codes with different sequence numbers never give the same tag (the multiplier is odd,
so seq -> seq * K is a bijection on 31 bits); different codes collide with odds 2^-31. Peers
compare tags on the device (dsl/signal.py, ops/allreduce_ll.py): no extra round trip.

The rule after an error is REFUSE: any collective error (a kernel's error record, a failed
launch, the simulator's rendezvous errors) marks the communicator broken, and every later
call raises CommunicatorBroken naming the first error, before it launches or writes
anything; close() makes every later call raise CommunicatorClosed.
"""
from __future__ import annotations

import collections
import functools
import zlib
from typing import Any, Callable

import numpy as np
import torch

from .. import layout
from .errors import (CollectiveError, CommunicatorBroken, CommunicatorClosed, SimError,
                     error_from_record)

SEQ_MULT = 0x9E3779B1
_Tensor = torch.Tensor
_CODES: dict[tuple, int] = {}      # description key -> code (process-wide, bounded)
_NAMES: dict[int, tuple] = {}      # code -> description key, to name a peer's tag


def tag_of(seq: int, code: int) -> int:
    return ((seq * SEQ_MULT) ^ code) & layout.TAG_MASK


def code_of(key: tuple) -> int:
    code = _CODES.get(key)
    if code is None:
        code = zlib.crc32(repr(key).encode()) & layout.TAG_MASK
        if len(_CODES) >= 8192:
            _CODES.clear()
            _NAMES.clear()
        _CODES[key] = code
        _NAMES[code] = key
    return code


def _short(v: Any) -> Any:
    """What a call's argument contributes to its identity: a tensor's dtype and shape, a
    plain value itself, anything else its type."""
    shape = getattr(v, "shape", None)
    if shape is not None and hasattr(v, "dtype"):
        return (v.dtype, shape)
    if v is None or isinstance(v, (bool, int, float, str)):
        return v
    return type(v).__name__


_DTYPE_NAMES = {"torch.bfloat16": "bf16", "torch.float16": "f16", "torch.float32": "f32"}


def _describe(args: tuple) -> tuple:
    """The positional arguments' part of a call's identity: the first tensor's dtype and
    shape (the entry points check every other tensor against it: residual and weight
    against x), every non-tensor argument itself. Kept lean: it runs on every eager call."""
    out, seen_tensor = [], False
    for v in args:
        if v.__class__ is _Tensor or isinstance(v, _Tensor):
            if not seen_tensor:
                out.append((v.dtype, v.shape))
                seen_tensor = True
        else:
            out.append(_short(v))
    return tuple(out)


def call_key(op: str, args: tuple, kwargs: dict, kernel: str, constexprs: dict,
             world: int) -> tuple:
    """The description of one launch of a call `op(*args, **kwargs)`: what its code hashes
    (`_call_id_for` for every launch, runtime/prepared.py once per prepared call)."""
    return (op, _describe(args), tuple([(n, _short(v)) for n, v in kwargs.items()])
            if kwargs else (), kernel, tuple(constexprs.items()), world)


def describe_key(key: tuple) -> str:
    """'all_reduce(bf16[64, 6144]) via allreduce_2stage T=bf16 W=4' for a description key."""
    op, args, kwargs, kernel, constexprs, world = key

    def show(a: Any) -> str:
        if isinstance(a, tuple) and len(a) == 2:
            return f"{_DTYPE_NAMES.get(str(a[0]), str(a[0]))}{list(a[1])}"
        return repr(a)
    inner = [show(a) for a in args] + [f"{k}={show(v)}" for k, v in kwargs]
    cx = " ".join(f"{k}={v}" for k, v in constexprs)
    return f"{op}({', '.join(inner)}) via {kernel} {cx}".rstrip()


class CallLog:
    """The recent calls of one communicator, to name tags in error messages."""

    def __init__(self, size: int = 256):
        self.recent: collections.deque = collections.deque(maxlen=size)

    def record(self, seq: int, tag: int, key: tuple) -> None:
        self.recent.append((seq, tag, key))

    def describe(self, tag: int) -> str:
        for seq, t, key in reversed(self.recent):
            if t == tag:
                return f"call #{seq} {describe_key(key)}"
        # a peer's call: try the sequence numbers near ours against every known code
        last = self.recent[-1][0] if self.recent else 0
        for d in sorted(range(-64, 65), key=abs):
            seq = (last + d) & 0xFFFFFFFF
            key = _NAMES.get((tag ^ (seq * SEQ_MULT)) & layout.TAG_MASK)
            if key is not None:
                return f"call #{seq} {describe_key(key)}"
        return f"an unknown call (tag {tag:#010x})"


def collective_call(fn: Callable) -> Callable:
    """Entry point of a collective: refuse when broken or closed, take the next sequence
    number before any input check, and mark the communicator broken when the call fails
    once it has begun launching (or with a collective error). A collective calling another
    (the fused entry's all-reduce) stays one call."""
    op = fn.__name__.lstrip("_")  # _comm_launch: a user kernel through comm.launch

    @functools.wraps(fn)
    def entry(self: Any, *args: Any, **kwargs: Any) -> Any:
        if self._call_depth:
            return fn(self, *args, **kwargs)
        if self._closed or self._broken is not None:
            self._refuse()
        self._seq = (self._seq + 1) & 0xFFFFFFFF
        self._call_entry = (op, args, kwargs)
        self._call_launches = 0
        self._call_depth = 1
        try:
            return fn(self, *args, **kwargs)
        except BaseException as e:
            if self._call_launches or isinstance(e, (CollectiveError, SimError)):
                self._mark_broken(e)
            raise
        finally:
            self._call_depth = 0
    return entry


def local_call(fn: Callable) -> Callable:
    """Entry point of a local kernel: no sequence number (it never waits for peers), but a
    broken or closed communicator refuses it like every other call."""
    @functools.wraps(fn)
    def entry(self: Any, *args: Any, **kwargs: Any) -> Any:
        if self._broken is not None or self._closed:
            self._refuse()
        return fn(self, *args, **kwargs)
    return entry


class CallIdentity:
    """Sequence numbers, tags and the broken state, mixed into Collectives. A backend calls
    `_call_id_for` for every collective launch (it fills the kernel's CallId parameter),
    `_record_error` to turn an error record into the exception it raises, and sets `_closed`
    in close(); `_write_signal(word, values)` writes i32 words of this rank's Signal."""

    _seq: int = 0
    _call_depth: int = 0
    _call_entry: tuple | None = None
    _call_launches: int = 0
    _broken: BaseException | None = None
    _closed: bool = False

    @functools.cached_property
    def _call_log(self) -> CallLog:
        return CallLog()

    def _refuse(self) -> None:
        if self._closed:
            raise CommunicatorClosed(self.rank)
        if self._broken is not None:
            raise CommunicatorBroken(self.rank, self._broken)

    def _mark_broken(self, e: BaseException) -> None:
        if self._broken is None and not isinstance(e, CommunicatorBroken):
            self._broken = e

    @property
    def broken(self) -> BaseException | None:
        """The first collective error of this communicator (None while it is healthy)."""
        return self._broken

    def _call_id_for(self, name: str, constexprs: dict, args: dict) -> int:
        """The tag of the current call's launch of kernel `name`: what the kernel's CallId
        parameter gets. A launch outside any collective entry is a call of its own."""
        if not self._call_depth:
            self._refuse()
            self._seq = (self._seq + 1) & 0xFFFFFFFF
            self._call_entry = None
        self._call_launches += 1
        op, a, k = self._call_entry or (name, (), {})
        key = call_key(op, a, k, name, constexprs, self.world)
        code = _CODES.get(key)
        if code is None:
            code = code_of(key)
        seq = self._seq
        tag = ((seq * SEQ_MULT) ^ code) & layout.TAG_MASK
        self._call_log.recent.append((seq, tag, key))
        return tag

    def _describe_tag(self, tag: int) -> str:
        return self._call_log.describe(tag)

    def _record_error(self, words: Any, kernel: str) -> CollectiveError:
        """The error an error record stands for; the communicator is broken from now on."""
        e = error_from_record(words, kernel, self.rank, self._describe_tag)
        self._mark_broken(e)
        return e

    def set_epochs_for_test(self, value: int) -> None:
        """Test hook (every rank, between calls): every block epoch, every barrier slot and
        the LL epoch of this rank's Signal as if `value` barriers (and LL launches) had run,
        so a test can cross the 2^31 and 2^32 wraps in a few calls."""
        v = value & 0xFFFFFFFF
        words = np.zeros(layout.SIG_LL_EPOCH + layout.MAX_BLOCKS, np.uint32)
        words[layout.SIG_SLOTS:layout.SIG_EPOCH:layout.SLOT_WORDS] = v  # epoch half, tag 0
        words[layout.SIG_EPOCH:layout.SIG_EPOCH + layout.MAX_BLOCKS] = v
        words[layout.SIG_LL_EPOCH:] = v  # every copy of the LL epoch
        self._refuse()
        self._write_signal(0, words.view(np.int32))
