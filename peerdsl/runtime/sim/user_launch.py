"""`comm.launch(op_or_kernel, grid=..., constexprs=None, **args)` on the simulator: the same
call as on the GPU Communicator (runtime/user_launch.py), with plain torch CPU tensors.

The kernel (a dsl kernel, or an op of the registry by name) is traced with `constexprs`, its
arguments checked by the checker the GPU uses (runtime/launch_args.py), then:
- a tensor for a Ptr is copied to a fresh device buffer and, after the launch, back into the
  tensor passed (results land where the user looks), and the buffer is freed;
- a PeerBuffer (`comm.register(t)`, `comm.peer_buffer(shape, dtype)`, `comm.signal`) passes
  its device addresses; the CPU tensors of this communicator's PeerBuffers are copied to the
  device before every `comm.launch` and back after it, so what peers wrote is there too;
- a tensor for a RegisteredPtrs is staged as the shipped collectives stage theirs (`_stage`).
A kernel that synchronizes (it takes peer pointers) launches on every rank together
(`launch_ir`, collective); any other runs on this rank alone (`launch_local`).
"""
from __future__ import annotations

import weakref
from typing import Any, Mapping, Sequence

import torch

from ... import layout
from ..launch_args import (LaunchArgError, Signature, check_args, check_grid,
                           signature_from_kernel)
from ..callid import CallIdentity, collective_call
from ..peer_buffers import PeerBuffer


class SimUserLaunch(CallIdentity):
    """Mixed into SimCommunicator; uses its memory primitives, `exchange`, `launch_ir`,
    `launch_local`, and `_stage` where the communicator has one (SimCollectiveComm)."""

    @property
    def signal(self) -> PeerBuffer:
        """This communicator's Signal as a PeerPtrs value: every rank's Signal address."""
        return PeerBuffer(self.peer_signals, self.rank, torch.int32,
                          (layout.SIGNAL_BYTES // 4,), None, "signal")

    def peer_buffer(self, shape: Sequence[int] | int, dtype: torch.dtype) -> PeerBuffer:
        """Collective: zeroed memory of `shape`/`dtype` on every rank; `.tensor` is this
        rank's part as a CPU tensor (kept in step around every comm.launch)."""
        shape = (shape,) if isinstance(shape, int) else tuple(int(s) for s in shape)
        return self._register_tensor(torch.zeros(shape, dtype=dtype))

    def _register_tensor(self, t: torch.Tensor) -> PeerBuffer:
        """Collective: `t`'s contents in peer-visible device memory; the tensor stays this
        rank's view of it (results of each comm.launch are copied back into it)."""
        if t.device.type != "cpu":
            raise ValueError(f"register: on the simulator pass CPU tensors, got one on "
                             f"{t.device}")
        if not t.is_contiguous():
            raise ValueError("register: the tensor is not contiguous (peers address it as one "
                             "flat buffer): pass t.contiguous()")
        buf = self.alloc(tuple(t.shape), t.dtype, "peer buffer")
        self.copy_in(buf, t)
        pb = PeerBuffer([int(a) for a in self.exchange(buf.addr)], self.rank, t.dtype,
                        tuple(t.shape), t)
        pb.backing = buf
        self.__dict__.setdefault("_peer_buffers", weakref.WeakSet()).add(pb)
        return pb

    def launch(self, op_or_kernel: Any, /, grid: int, constexprs: Mapping[str, Any] | None = None,
               **args: Any) -> None:
        """Launch a user kernel: see the module docstring and the GPU Communicator's."""
        if self._broken is not None or self._closed:
            self._refuse()
        kernel = self._user_kernel(op_or_kernel)
        from .comm import _ir_of
        constexprs = self._as_built(op_or_kernel, kernel, dict(constexprs or {}))
        traced = _ir_of(kernel, constexprs)
        sig = getattr(traced, "_launch_signature", None)
        if sig is None:
            sig = traced._launch_signature = signature_from_kernel(kernel, traced)
        if sig.synchronizes:  # a call of every rank: it takes the next sequence number first
            self._user_collective(traced.name, (traced, sig, args, dict(constexprs or {})),
                                  grid=grid)
        else:
            self._user_launch(traced, sig, grid, args, {})

    @collective_call
    def _comm_launch(self, op: str, launch: tuple, grid: int) -> None:
        """The call identity peers compare is the op, its variant, the world and the grid:
        a kernel's own arguments (its rank, addresses, even shapes) may differ by rank."""
        traced, sig, args, constexprs = launch
        self._user_launch(traced, sig, grid, args, constexprs)

    _user_collective = collective_call(_comm_launch)

    def _user_launch(self, traced: Any, sig: Signature, grid: int, args: Mapping[str, Any],
                     constexprs: dict) -> None:
        values = check_args(sig, args, self._implicit_args(traced, args),
                            device=torch.device("cpu"), sim=True)
        grid = check_grid(sig, grid, layout.MAX_BLOCKS)
        mirrors = list(self.__dict__.get("_peer_buffers", ()))
        by_tensor = {id(pb.tensor): pb for pb in mirrors}
        temporaries: list[tuple[torch.Tensor, Any]] = []
        synced = False
        try:
            dev_args = self._device_args(sig, values, by_tensor, temporaries)
            for pb in mirrors:
                self.copy_in(pb.backing, pb.tensor)
            synced = True
            if sig.synchronizes:
                tag = self._call_id_for(traced.name, constexprs, dev_args)
                for name in sig.runtime_filled:  # the kernel's dsl.CallId parameters
                    dev_args[name] = tag
                self.launch_ir(traced, None, grid, dev_args)
            else:
                self.launch_local(traced, None, grid, dev_args)
        finally:  # what the kernel wrote is there even if it then failed (as on a GPU)
            for pb in mirrors if synced else ():
                pb.tensor.copy_(self.to_torch(pb.backing))
            for t, buf in temporaries:
                t.copy_(self.to_torch(buf))
                with self.job.system.lock:
                    self.device.free(buf)

    def _implicit_args(self, entry_or_kernel: Any, args: Mapping[str, Any]) -> dict[str, Any]:
        """Runtime-filled argument values: a placeholder for each `dsl.CallId` parameter,
        set to the call's tag at launch."""
        return {name: 0 for name in entry_or_kernel._launch_signature.runtime_filled}

    def launch_constexprs(self, op_or_kernel: Any,
                          constexprs: Mapping[str, Any] | None = None) -> dict[str, Any]:
        """Every constexpr of the variant `launch(op_or_kernel, constexprs=...)` runs (the
        GPU Communicator's method): here the registered variant for this target that they
        pick, else they themselves with the kernel's defaults; in the manifest's JSON form
        (a dtype as its name)."""
        from ..manifest import constexpr_json
        kernel = self._user_kernel(op_or_kernel)
        given = self._as_built(op_or_kernel, kernel, dict(constexprs or {}))
        params = kernel.signature.parameters
        defaults = {n: params[n].default for n in kernel.constexpr_names
                    if params[n].default is not params[n].empty}
        return {k: constexpr_json(v) for k, v in {**defaults, **given}.items()}

    def _as_built(self, op_or_kernel: Any, kernel: Any, constexprs: dict) -> dict:
        """The constexprs of the one registered variant (for this simulator's target) that
        `constexprs` names, as the GPU's manifest lookup picks it (a subset that picks one):
        so a constexpr the variants set per target and the caller does not name (the norm
        kernels' B) is the built one here too. Given as they are where no variant matches
        (the simulator traces any constexprs, schedules no build holds included), except a
        dtype that none of the op's registered variants takes (T=float32 for a bf16/f16 op):
        that raises, as no GPU build could hold it. Several that match raise, as on the GPU."""
        from ...lowering.targets import get_target
        from ...ops.registry import load_all
        from ..manifest import constexpr_json
        query = {k: constexpr_json(v) for k, v in constexprs.items()}
        what = op_or_kernel if isinstance(op_or_kernel, str) else kernel.name
        cache = self.__dict__.setdefault("_built_variants", {})
        key = (op_or_kernel if isinstance(op_or_kernel, str) else id(kernel))
        variants = cache.get(key)  # (constexprs, their JSON forms) per registered variant
        if variants is None:
            specs = [spec for name, spec in load_all().items()
                     if name == op_or_kernel or spec.kernel is kernel]
            try:
                built = specs[0].variants(get_target(self.target)) if len(specs) == 1 else []
            except Exception:  # noqa: BLE001 - a build-time error: `peerdsl build` reports it
                built = []
            variants = cache[key] = [(v, {k: constexpr_json(x) for k, x in v.items()})
                                     for v in built]
        hits = [v for v, as_json in variants
                if all(k in as_json and as_json[k] == q for k, q in query.items())]
        if len(hits) > 1:  # the GPU's manifest lookup refuses it too (loader_base.find_entry)
            from ..manifest import ManifestError
            names = sorted(set().union(*hits) - set(query))
            raise ManifestError(f"{what!r}: constexprs {query} match {len(hits)} registered "
                                f"variants for {self.target}; name more of {names}")
        if not hits and variants:
            for k, given in constexprs.items():
                taken = {as_json[k] for _, as_json in variants if k in as_json}
                if _is_dtype(given) and taken and query[k] not in taken:
                    raise TypeError(f"{what!r} takes {k} in {sorted(taken)} (its registered "
                                    f"variants for {self.target}), got {query[k]}")
        return {**hits[0], **constexprs} if hits else constexprs

    def _user_kernel(self, op_or_kernel: Any) -> Any:
        from ...dsl.kernel import Kernel
        if isinstance(op_or_kernel, Kernel):
            return op_or_kernel
        if isinstance(op_or_kernel, str):
            from ...ops.registry import load_all
            ops = load_all()
            if op_or_kernel not in ops:
                raise KeyError(f"no op {op_or_kernel!r} is registered; registered: "
                               f"{sorted(ops)} (peerdsl.register_op(name, kernel, variants) "
                               "adds one, or pass the dsl kernel itself)")
            return ops[op_or_kernel].kernel
        raise TypeError(f"launch takes a registered op name (str) or a dsl kernel "
                        f"(@dsl.kernel), got {type(op_or_kernel).__name__}; an ir.Kernel with "
                        "positional arguments goes to launch_ir(kernel, constexprs, grid, args)")

    def _device_args(self, sig: Signature, values: dict[str, Any], by_tensor: dict[int, Any],
                     temporaries: list) -> dict[str, Any]:
        staged = [p.name for p in sig.params if p.kind == "registered_ptrs"
                  and isinstance(values[p.name], torch.Tensor)]
        if len(staged) > 1:  # as on the GPU: one tensor per launch goes into the pool
            raise LaunchArgError(
                f"{sig.kernel}: tensors for the RegisteredPtrs {staged}: one tensor per launch "
                "is staged in the registered pool; pass comm.register(t) for the others")
        out: dict[str, Any] = {}
        made: dict[int, Any] = {}
        for p in sig.params:
            v = values[p.name]
            if isinstance(v, torch.Tensor) and id(v) in by_tensor:
                v = by_tensor[id(v)]  # a PeerBuffer's own tensor: its device memory
            if p.kind == "peer_ptrs":
                v = list(v.addresses) if isinstance(v, PeerBuffer) else [int(a) for a in v]
            elif isinstance(v, PeerBuffer):
                v = v.address if p.kind == "ptr" else self._sim_table(v)
            elif p.name in staged:
                stage = getattr(self, "_stage", None)
                if stage is None:
                    raise LaunchArgError(f"{sig.kernel}: a tensor for RegisteredPtrs "
                                         f"{p.name!r} is staged in the registered pool, which "
                                         "this communicator lacks (peerdsl.sim.run's default "
                                         "communicator has it); pass comm.register(t)")
                v = stage(v)
            elif isinstance(v, torch.Tensor):
                buf = made.get(id(v))
                if buf is None:  # one device copy per tensor, however often it is passed
                    buf = made[id(v)] = self.to_device(v.contiguous(), p.name)
                    temporaries.append((v, buf))
                v = buf.addr
            out[p.name] = v
        return out

    def _sim_table(self, pb: PeerBuffer) -> int:
        """The device address of `pb`'s peers' table (a RegisteredPtrs value), made once."""
        if pb.table is None:
            pb.table = self.alloc((layout.MAX_RANKS,), torch.int64, "peer buffer table")
            self.copy_in(pb.table, torch.tensor(layout.peer_row(list(pb.addresses)),
                                                dtype=torch.int64))
        return pb.table.addr


def _is_dtype(value: Any) -> bool:
    """A torch dtype or a DSL scalar type, as a constexpr like T takes."""
    from ...dsl import ir
    return isinstance(value, (torch.dtype, ir.ScalarType))
