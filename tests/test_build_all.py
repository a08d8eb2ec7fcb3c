"""Every registered op variant builds for every target and its manifest loads (runs with
--long: a cold build of all of them takes minutes on a small machine)."""
from __future__ import annotations

import pytest

from peerdsl.lowering import build as B
from peerdsl.lowering.targets import TARGETS


@pytest.mark.slow
@pytest.mark.parametrize("arch", list(TARGETS))
def test_build_every_op(arch, tmp_path, long_run):
    if not long_run:
        pytest.skip("builds every op variant; run with --long")
    from peerdsl.runtime.manifest import load_manifest
    m = B.build(arch, None, str(tmp_path))
    assert m["kernels"]
    loaded = load_manifest(tmp_path, arch, verify=True)  # sha256 + ELF header of each file
    assert set(loaded.kernels) == set(m["kernels"])
    for name, k in m["kernels"].items():
        r = k["resources"]
        if TARGETS[arch].is_amd:
            assert r["scratch_bytes"] == 0 and r["vgpr_spill"] == 0, (name, r)
        else:
            assert r["spill_stores"] == 0 and r["stack_bytes"] == 0, (name, r)
