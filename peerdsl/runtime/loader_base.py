"""What the CUDA and HIP loaders share: a manifest of one vendor, kernels found by op +
constexprs, and one loaded kernel object per instance. A backend supplies `_load`."""
from __future__ import annotations

import os
from typing import Any

from .manifest import KernelEntry, Manifest, load_manifest


class ManifestLoader:
    vendor = ""        # as the manifest names it
    vendor_name = ""   # as the error message does

    def __init__(self, manifest: Manifest | str | os.PathLike, arch: str | None,
                 device: int):
        self.manifest = manifest if isinstance(manifest, Manifest) else load_manifest(
            manifest, arch)
        if self.manifest.vendor != self.vendor:
            raise ValueError(f"{type(self).__name__} needs an {self.vendor_name} manifest, got "
                             f"{self.manifest.arch}")
        self.device = device
        self._kernels: dict[str, Any] = {}

    def kernel(self, op: str, **constexprs: Any) -> Any:
        """The kernel of `op` with these constexprs (JSON names: T='bf16' or torch dtypes)."""
        return self.load(self.manifest.find(op, constexprs))

    def instance(self, name: str) -> Any:
        return self.load(self.manifest.get(name))

    def load(self, entry: KernelEntry) -> Any:
        k = self._kernels.get(entry.name)
        if k is None:
            k = self._kernels[entry.name] = self._load(entry)
        return k

    def _load(self, entry: KernelEntry) -> Any:
        raise NotImplementedError
