"""NormResult is a tuple (index, len, unpack, isinstance) with named fields, and `python -m
peerdsl` runs the command line."""
from __future__ import annotations

import copy
import os
import pickle
import subprocess
import sys

import pytest
import torch

import peerdsl.sim
from peerdsl.runtime.collectives import NormResult

T = [torch.full((2, 8), float(i)) for i in range(4)]


def test_plain_form_is_out_residual_out():
    out, res = T[0], T[1]
    r = NormResult(out, res)
    assert isinstance(r, tuple) and len(r) == 2
    assert r[0] is out and r[1] is res and r[-1] is res and r[-2] is out
    a, b = r
    assert a is out and b is res
    assert r.out is out and r.residual_out is res and r.q is None and r.scale is None
    assert r.mirror is None and r._fields == ("out", "residual_out")
    assert r._asdict() == {"out": out, "residual_out": res}
    assert list(r[:]) == [out, res] and tuple(r) == (out, res)
    with pytest.raises(IndexError):
        r[2]


@pytest.mark.parametrize("mirror", [False, True])
def test_fp8_form_is_q_residual_out_scale_mirror(mirror):
    q, res, scale, m = T
    r = NormResult(None, res, q, scale, m if mirror else None)
    items = (q, res, scale) + ((m,) if mirror else ())
    assert len(r) == len(items) and all(x is y for x, y in zip(r, items))
    assert r[-1] is items[-1] and r[0] is q
    assert r.out is None and r.q is q and r.scale is scale and r.residual_out is res
    assert r.mirror is (m if mirror else None)
    assert r._fields == ("q", "residual_out", "scale") + (("mirror",) if mirror else ())


def test_immutable_pickles_and_copies():
    r = NormResult(None, T[1], T[0], T[2], T[3])
    with pytest.raises(AttributeError, match="immutable"):
        r.out = T[0]
    for other in (pickle.loads(pickle.dumps(r)), copy.deepcopy(r), copy.copy(r)):
        assert type(other) is NormResult and other._fields == r._fields
        assert all(torch.equal(a, b) for a, b in zip(other, r))
        assert other.out is None and torch.equal(other.mirror, T[3])
    assert "NormResult(q=tensor(shape=(2, 8)" in repr(r)


def test_simulator_results_index_like_they_unpack(monkeypatch):
    monkeypatch.setenv("PEERDSL_FUSED_PATH", "fused_1stage")
    g = torch.Generator().manual_seed(0)
    xs = [torch.randn(2, 2880, generator=g).to(torch.bfloat16) for _ in range(2)]
    residual = torch.randn(2, 2880, generator=g).to(torch.bfloat16)
    weight = torch.rand(2880, generator=g).to(torch.bfloat16) + 0.5

    def body(comm):
        res = comm.fused_allreduce_rmsnorm(xs[comm.rank], residual, weight)
        fp8 = comm.fused_allreduce_rmsnorm(xs[comm.rank], residual, weight, fp8_out=True,
                                           bf16_mirror=True)
        return res, fp8

    for res, fp8 in peerdsl.sim.run(2, body, seed=0):
        assert isinstance(res, tuple) and len(res) == 2
        out, res_out = res
        assert res[0] is out is res.out and res[-1] is res_out is res.residual_out
        assert out.shape == (2, 2880) and out.dtype == torch.bfloat16
        assert len(fp8) == 4 and fp8[0] is fp8.q and fp8[2] is fp8.scale
        assert fp8[-1] is fp8.mirror and fp8.out is None
        assert fp8.q.dtype == torch.float8_e4m3fn and fp8.scale.shape == (2, 1)
        assert torch.equal(fp8.mirror, out)  # the mirror is the T output of the same call
        assert torch.equal(fp8.residual_out, res_out)


def test_python_dash_m_peerdsl():
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    env = {**os.environ, "PYTHONPATH": root + os.pathsep + os.environ.get("PYTHONPATH", "")}
    p = subprocess.run([sys.executable, "-m", "peerdsl", "--help"], capture_output=True,
                       text=True, env=env, timeout=120)
    assert p.returncode == 0, p.stderr
    assert "build" in p.stdout and "usage: peerdsl" in p.stdout
    p = subprocess.run([sys.executable, "-m", "peerdsl", "build", "--arch", "gfx7"],
                       capture_output=True, text=True, env=env, timeout=120)
    assert p.returncode == 2 and "supported: gfx1250" in p.stderr

