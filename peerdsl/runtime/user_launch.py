"""`comm.launch(op_or_kernel, grid=..., constexprs=None, **args)` on the GPU Communicator:
a user kernel (a registered op by name, or the DSL kernel itself) from the ahead-of-time
manifest, its arguments checked against the signature the manifest records
(launch_args.py, the checker the simulator uses too), then launched through the
communicator's own `_launch`, so user launches share its kernel cache, resident-grid cap,
error checks and graph-capture behaviour.

Values: a Ptr takes a tensor (on this communicator's device), a PeerBuffer (this rank's
memory), an int address or None; a PeerPtrs takes a PeerBuffer (`comm.register(t)`,
`comm.peer_buffer(shape, dtype)`, `comm.signal`) or a list of addresses; a RegisteredPtrs
takes a tensor, staged the way the shipped collectives stage theirs (`_stage`: copied into
the registered pool eagerly, read in place under `comm.graph_capture()`), or a PeerBuffer
(its peers' table). Uses the loader's `entry_for`/`load`, `_launch`, `_stage`,
`_resident_cap`, `_registered_table`, `device`.
"""
from __future__ import annotations

from typing import Any, Mapping

from .. import layout
from .callid import collective_call
from .launch_args import LaunchArgError, Signature, check_args, check_grid, signature_from_entry
from .peer_buffers import PeerBuffer


class UserLaunch:
    def launch(self, op_or_kernel: Any, /, grid: int, constexprs: Mapping[str, Any] | None = None,
               **args: Any) -> None:
        """Launch a user kernel on this rank (every rank launches a kernel that synchronizes,
        as for any collective). `op_or_kernel`: a registered op name, or a dsl kernel whose
        variant for `constexprs` is in the manifest; `grid`: blocks (at most what can be
        resident at once for a kernel that synchronizes); `args`: the kernel's parameters by
        name (a `dsl.CallId` parameter is filled by the runtime). Everything is checked
        before anything runs; asynchronous like any launch."""
        if self._broken is not None or self._closed:
            self._refuse()
        entry = self.loader.entry_for(op_or_kernel, constexprs)
        sig = self._user_signature(entry, None if isinstance(op_or_kernel, str)
                                   else op_or_kernel)
        if sig.synchronizes:  # a call of every rank: it takes the next sequence number first
            self._user_collective(entry.op, (entry, sig, args), grid=grid)
        else:
            self._user_launch(entry, sig, grid, args)

    def launch_constexprs(self, op_or_kernel: Any,
                          constexprs: Mapping[str, Any] | None = None) -> dict[str, Any]:
        """Every constexpr of the variant `launch(op_or_kernel, constexprs=...)` runs: the
        built one those constexprs pick, with what its variants set per target (a host
        reference that must model the kernel, e.g. the norm kernels' threads a row B, reads
        it here). Raises as `launch` does when none is built."""
        return dict(self.loader.entry_for(op_or_kernel, constexprs).constexprs)

    @collective_call
    def _comm_launch(self, op: str, launch: tuple, grid: int) -> None:
        """The call identity peers compare is the op, its variant, the world and the grid:
        a kernel's own arguments (its rank, addresses, even shapes) may differ by rank."""
        entry, sig, args = launch
        self._user_launch(entry, sig, grid, args)

    _user_collective = collective_call(_comm_launch)

    def _user_launch(self, entry: Any, sig: Signature, grid: int,
                     args: Mapping[str, Any]) -> None:
        values = check_args(sig, args, self._implicit_args(entry, args), device=self.device)
        cap = None
        if sig.synchronizes:
            cap = min(layout.MAX_BLOCKS, self._user_resident_cap(entry))
        grid = check_grid(sig, grid, cap)
        self._launch(entry.op, dict(entry.constexprs), grid, self._launch_values(sig, values),
                     local=not sig.synchronizes)

    def _implicit_args(self, entry_or_kernel: Any, args: Mapping[str, Any]) -> dict[str, Any]:
        """Runtime-filled argument values, merged into the user's before the check: a
        placeholder for each `dsl.CallId` parameter, which `_launch` sets to the call's tag."""
        sig = self._user_signature(entry_or_kernel, None)
        return {name: 0 for name in sig.runtime_filled}

    def _user_signature(self, entry: Any, kernel: Any) -> Signature:
        cache = self.__dict__.setdefault("_user_signatures", {})
        sig = cache.get(entry.name)
        if sig is None:
            if kernel is None and not any(a.role for a in entry.args):
                kernel = _registered_kernel(entry.op)  # an old manifest: roles from the DSL
            sig = cache[entry.name] = signature_from_entry(entry, kernel)
        return sig

    def _user_resident_cap(self, entry: Any) -> int:
        caps = self.__dict__.setdefault("_user_caps", {})
        cap = caps.get(entry.name)
        if cap is None:
            cap = caps[entry.name] = self._resident_cap(self.loader.load(entry))
        return cap

    def _launch_values(self, sig: Signature, values: dict[str, Any]) -> dict[str, Any]:
        """Checked values as the packer takes them: addresses for PeerBuffers, the staged
        table for a RegisteredPtrs tensor."""
        staged = [p.name for p in sig.params if p.kind == "registered_ptrs"
                  and not isinstance(values[p.name], (int, PeerBuffer))]
        if len(staged) > 1:  # eagerly both would be copied to the start of the pool
            raise LaunchArgError(
                f"{sig.kernel}: tensors for the RegisteredPtrs {staged}: one tensor per launch "
                "is staged in the registered pool; pass comm.register(t) for the others")
        out = {}
        for p in sig.params:
            v = values[p.name]
            if p.kind == "peer_ptrs":
                v = list(v.addresses) if isinstance(v, PeerBuffer) else [int(a) for a in v]
            elif isinstance(v, PeerBuffer):
                v = v.address if p.kind == "ptr" else self._registered_table(v)
            elif p.name in staged:
                v = self._stage(v)
            out[p.name] = v
        return out

def _registered_kernel(op: str) -> Any:
    from ..ops.registry import load_all
    spec = load_all().get(op)
    return spec.kernel if spec is not None else None
