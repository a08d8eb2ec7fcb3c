"""Manifest loading/validation and kernarg packing (CPU only, no driver)."""
from __future__ import annotations

import json
import os
import socket
import struct

import pytest
import torch

from peerdsl.dsl import ir
from peerdsl.runtime import kernarg
from peerdsl.runtime.cuda.fdpass import recv_fd, recv_fds, send_fd, send_fds
from peerdsl.runtime.cuda.ipc import IpcHandle
from peerdsl.runtime.cuda.vmm import round_up
from peerdsl.runtime.kernarg import KernargError, LaunchBuffer, dim3, read_extra, read_params
from peerdsl.runtime.manifest import ManifestError, load_manifest, pack_kernargs
from test_runtime_loader_helpers import FakeGpuTensor, fake_elf, write_manifest

A, B, OUT = 0x7F0000000000, 0x7F0000010000, 0x7F0000020000


@pytest.fixture
def man(tmp_path):
    write_manifest(tmp_path)
    return load_manifest(tmp_path, "sm_90")


# ---- loading ------------------------------------------------------------------------------

def test_load_forms(tmp_path):
    p = write_manifest(tmp_path)
    for where, arch in ((tmp_path, "sm_90"), (tmp_path, None), (p.parent, None), (p, None)):
        m = load_manifest(where, arch)
        assert m.arch == "sm_90" and m.vendor == "nvidia" and m.wave_size == 32
        assert sorted(m.kernels) == ["peer_probe_w8", "vector_add_bf16", "vector_add_f16"]
        assert m.ops() == ["peer_probe", "vector_add"]
    e = m.get("vector_add_bf16")
    assert e.path.is_file() and e.code_object().startswith(b"\x7fELF")
    assert [a.name for a in e.args] == ["a", "b", "out", "n"] and e.kernarg_size == 28


def test_several_archs_need_arch(tmp_path):
    write_manifest(tmp_path, "sm_90")
    write_manifest(tmp_path, "gfx1250")
    with pytest.raises(ManifestError, match="pass arch"):
        load_manifest(tmp_path)
    assert load_manifest(tmp_path, "gfx1250").wave_size == 32
    with pytest.raises(ManifestError, match="no manifest for gfx942"):
        load_manifest(tmp_path, "gfx942")


def test_missing_paths(tmp_path):
    with pytest.raises(ManifestError, match="does not exist"):
        load_manifest(tmp_path / "nope")
    write_manifest(tmp_path)
    os.remove(tmp_path / "sm_90" / "vector_add_f16.cubin")
    with pytest.raises(ManifestError, match="vector_add_f16: code object file missing"):
        load_manifest(tmp_path, "sm_90")
    m = load_manifest(tmp_path, "sm_90", verify=False)  # lazily: fails when read
    with pytest.raises(ManifestError, match="missing"):
        m.get("vector_add_f16").code_object()


def test_sha_mismatch(tmp_path):
    write_manifest(tmp_path)
    m = load_manifest(tmp_path, "sm_90")
    (tmp_path / "sm_90" / "vector_add_bf16.cubin").write_bytes(fake_elf("sm_90", b"changed"))
    with pytest.raises(ManifestError, match="sha256 mismatch"):
        m.get("vector_add_bf16").code_object()  # re-checked at read time too
    with pytest.raises(ManifestError, match="vector_add_bf16: sha256 mismatch"):
        load_manifest(tmp_path, "sm_90")


def test_unknown_and_inconsistent_arch(tmp_path):
    p = write_manifest(tmp_path)
    doc = json.loads(p.read_text())
    for key, val, msg in (("arch", "sm_100", "unknown arch 'sm_100'"),
                          ("vendor", "amd", "vendor 'amd' is wrong"),
                          ("wave_size", 64, "wave_size 64 is wrong"),
                          ("fp8_format", "e4m3fnuz", "fp8_format")):
        p.write_text(json.dumps({**doc, key: val}))
        with pytest.raises(ManifestError, match=msg):
            load_manifest(p)
    p.write_text(json.dumps(doc))
    with pytest.raises(ManifestError, match="is for sm_90, asked for gfx1250"):
        load_manifest(p, "gfx1250")
    with pytest.raises(ManifestError, match="unknown arch 'gfx9000'"):
        load_manifest(tmp_path, "gfx9000")
    p.write_text("{not json")
    with pytest.raises(ManifestError, match="not valid JSON"):
        load_manifest(p)


def test_code_object_header_checked(tmp_path):
    # a gfx942 object listed in a gfx1250 manifest, and a cubin listed as AMD
    write_manifest(tmp_path, "gfx1250")
    d = tmp_path / "gfx1250"
    doc = json.loads((d / "manifest.json").read_text())
    for data, msg in ((fake_elf("gfx942"), "for gfx942, manifest says gfx1250"),
                      (fake_elf("sm_90"), "e_machine 190"),
                      (b"not an elf" * 10, "not a 64-bit ELF")):
        (d / "vector_add_bf16.hsaco").write_bytes(data)
        import hashlib
        doc["kernels"]["vector_add_bf16"]["sha256"] = hashlib.sha256(data).hexdigest()
        (d / "manifest.json").write_text(json.dumps(doc))
        with pytest.raises(ManifestError, match=msg):
            load_manifest(tmp_path, "gfx1250")


@pytest.mark.parametrize("mutate, msg", [
    (lambda k: k.pop("symbol"), r"lacks \['symbol'\]"),
    (lambda k: k["args"][3].update(offset=22), "not aligned"),
    (lambda k: k["args"][1].update(offset=4), "not aligned"),
    (lambda k: k["args"][1].update(offset=0), "overlap"),
    (lambda k: k["args"][3].update(size=8), "size 8 but type i32"),
    (lambda k: k.update(kernarg_size=24), "past kernarg_size 24"),
    (lambda k: k["args"][0].update(type="ptr<q7>"), "unknown pointer element"),
    (lambda k: k["args"][3].update(type="u128"), "unknown argument type"),
    (lambda k: k["args"].append(dict(k["args"][0])), "appears twice"),
    (lambda k: k.update(block_size=2048), "block_size 2048"),
])
def test_entry_validation(tmp_path, mutate, msg):
    p = write_manifest(tmp_path)
    doc = json.loads(p.read_text())
    mutate(doc["kernels"]["vector_add_bf16"])
    p.write_text(json.dumps(doc))
    with pytest.raises(ManifestError, match=msg):
        load_manifest(p)


# ---- finding kernels ------------------------------------------------------------------------

def test_find_by_constexprs(man):
    assert man.find("vector_add", T="bf16").name == "vector_add_bf16"
    assert man.find("vector_add", {"T": "f16"}).name == "vector_add_f16"
    assert man.find("vector_add", T=torch.bfloat16).name == "vector_add_bf16"
    assert man.find("vector_add", T=ir.f16).name == "vector_add_f16"   # DSL dtype
    assert man.find("peer_probe").name == "peer_probe_w8"             # only one variant
    assert man.find("peer_probe", WORLD=8, T="bf16").name == "peer_probe_w8"
    with pytest.raises(ManifestError, match="match 2 'vector_add' kernels"):
        man.find("vector_add")
    with pytest.raises(ManifestError, match="built variants"):
        man.find("vector_add", T="f32")
    with pytest.raises(ManifestError, match="no constexpr"):
        man.find("vector_add", T="bf16", H=6144)
    with pytest.raises(ManifestError, match="ops: \\['peer_probe', 'vector_add'\\]"):
        man.find("all_reduce")
    with pytest.raises(ManifestError, match="built variants"):
        man.find("peer_probe", WORLD="8")   # JSON types differ: 8 != "8"
    with pytest.raises(ManifestError, match="no kernel instance"):
        man.get("nope")


# ---- packing --------------------------------------------------------------------------------

def test_pack_vector_add_layout(man):
    e = man.find("vector_add", T="bf16")
    data = pack_kernargs(e, {"a": A, "b": B, "out": OUT, "n": 1000})
    assert len(data) == 28
    assert struct.unpack("<QQQi", data) == (A, B, OUT, 1000)
    assert e.pack({"a": A, "b": B, "out": OUT, "n": -5})[24:] == struct.pack("<i", -5)
    assert pack_kernargs(json.loads(man.path.read_text())["kernels"]["vector_add_bf16"],
                         {"a": A, "b": B, "out": OUT, "n": 1000}) == data  # raw dict entry


def test_pack_padding_is_zero(man):
    e = man.get("peer_probe_w8")
    data = e.pack({"sig": [A], "rank": 1, "world": 2, "epoch": 3, "scale": 0.5})
    assert len(data) == 88 and data[84:] == b"\0" * 4
    assert kernarg.unpack_args(e.args, data)["scale"] == 0.5


def test_missing_and_unknown_named(man):
    e = man.find("vector_add", T="bf16")
    with pytest.raises(KernargError, match=r"missing arguments \['n'\]"):
        e.pack({"a": A, "b": B, "out": OUT})
    with pytest.raises(KernargError, match=r"unknown arguments \['m'\]"):
        e.pack({"a": A, "b": B, "out": OUT, "n": 1, "m": 2})


@pytest.mark.parametrize("name, value, msg", [
    ("n", 2**31, "out of range for i32"),
    ("n", -2**31 - 1, "out of range for i32"),
    ("n", 1.5, "needs an int"),
    ("n", True, "needs an int"),
    ("n", "3", "needs an int"),
    ("a", -1, "not a 64-bit address"),
    ("a", 2**64, "not a 64-bit address"),
    ("a", 1.0, "not a pointer"),
    ("a", A + 1, "not 2-byte aligned"),
    ("a", "0x10", "expected a device address"),
])
def test_value_errors(man, name, value, msg):
    args = {"a": A, "b": B, "out": OUT, "n": 1, name: value}
    with pytest.raises(KernargError, match=msg):
        man.find("vector_add", T="bf16").pack(args)


def test_scalar_ranges(man):
    e = man.get("peer_probe_w8")
    base = {"sig": [A], "rank": 0, "world": 1, "epoch": 0, "scale": 1.0}
    e.pack({**base, "rank": 2**31 - 1, "epoch": -2**63})
    with pytest.raises(KernargError, match="out of range for i64"):
        e.pack({**base, "epoch": 2**63})
    with pytest.raises(KernargError, match="overflows f32"):
        e.pack({**base, "scale": 1e39})
    e.pack({**base, "scale": float("inf"), "world": torch.tensor(3).item()})
    import numpy as np
    assert e.pack({**base, "rank": np.int32(7)})[64:68] == struct.pack("<i", 7)


def test_peer_table(man):
    e = man.get("peer_probe_w8")
    assert e.peer_tables == {"sig": [f"sig_{i}" for i in range(8)]}
    base = {"rank": 0, "world": 3, "epoch": 1, "scale": 1.0}
    data = e.pack({**base, "sig": [A, B, OUT]})
    assert struct.unpack_from("<8Q", data) == (A, B, OUT, A, A, A, A, A)
    members = {f"sig_{i}": A + 4 * i for i in range(8)}   # members one by one also work
    assert struct.unpack_from("<8Q", e.pack({**base, **members}))[7] == A + 28
    with pytest.raises(KernargError, match="takes 1..8 entries, got 9"):
        e.pack({**base, "sig": [A] * 9})
    with pytest.raises(KernargError, match="takes 1..8 entries, got 0"):
        e.pack({**base, "sig": []})
    with pytest.raises(KernargError, match="pass a list"):
        e.pack({**base, "sig": A})
    with pytest.raises(KernargError, match="given both"):
        e.pack({**base, "sig": [A], "sig_3": B})
    with pytest.raises(KernargError, match="missing arguments.*peer tables: \\['sig'\\]"):
        e.pack(base)


def test_tensors(man):
    e = man.find("vector_add", T="bf16")
    ok = FakeGpuTensor(torch.bfloat16, A)
    data = e.pack({"a": ok, "b": FakeGpuTensor(torch.bfloat16, B), "out": OUT, "n": 1},
                  device=0)
    assert struct.unpack_from("<QQ", data) == (A, B)
    with pytest.raises(KernargError, match="dtype float16 does not match ptr<bf16>"):
        e.pack({"a": FakeGpuTensor(torch.float16, A), "b": B, "out": OUT, "n": 1})
    with pytest.raises(KernargError, match="is on cpu, expected a GPU tensor"):
        e.pack({"a": torch.zeros(4, dtype=torch.bfloat16), "b": B, "out": OUT, "n": 1})
    with pytest.raises(KernargError, match="kernel launches on device 0"):
        e.pack({"a": FakeGpuTensor(torch.bfloat16, A, index=1), "b": B, "out": OUT, "n": 1},
               device=0)
    assert struct.unpack_from("<Q", e.pack({"a": None, "b": B, "out": OUT, "n": 1}))[0] == 0


def test_pointer_element_rules():
    specs = kernarg.arg_specs_from_json([
        {"name": "q", "type": "ptr<i8,global>", "offset": 0, "size": 8},
        {"name": "v", "type": "ptr<bf16x8>", "offset": 8, "size": 8},
        {"name": "f", "type": "ptr<i32>", "offset": 16, "size": 8},
        {"name": "raw", "type": "ptr", "offset": 24, "size": 8}])
    fp8 = FakeGpuTensor(torch.float8_e4m3fn, A)
    good = {"q": fp8, "v": A, "f": FakeGpuTensor(torch.int32, B), "raw": A + 1}
    kernarg.pack_args(specs, 32, good)
    kernarg.pack_args(specs, 32, {**good, "q": FakeGpuTensor(torch.uint8, A + 1)})
    with pytest.raises(KernargError, match="dtype bfloat16 does not match ptr<i8,global>"):
        kernarg.pack_args(specs, 32, {**good, "q": FakeGpuTensor(torch.bfloat16, A)})
    with pytest.raises(KernargError, match="not 16-byte aligned"):
        kernarg.pack_args(specs, 32, {**good, "v": A + 8})
    assert kernarg.parse_type("ptr<bf16x8,global>").pointee_bytes == 16
    assert kernarg.parse_type("ptr<global>").scalar is None


# ---- launch helpers, fd passing, handles --------------------------------------------------

def test_dim3_and_launch_buffer():
    assert dim3(5, "grid") == (5, 1, 1) and dim3((2, 3), "grid") == (2, 3, 1)
    for bad in (0, (1, 2, 3, 4), (1, -1)):
        with pytest.raises(ValueError):
            dim3(bad, "grid")
    data = bytes(range(28))
    lb = LaunchBuffer(data)
    assert lb.address % 16 == 0
    words, got = read_extra(lb.extra(1, 2, 0))
    assert (words[0], words[2], words[4]) == (1, 2, 0) and got == data
    assert read_params(lb.params([0, 8, 24]), [8, 8, 4]) == [data[0:8], data[8:16], data[24:28]]


def test_fd_passing_roundtrip():
    a, b = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    r1, w1 = os.pipe()
    r2, w2 = os.pipe()
    try:
        send_fds(a, [r1, r2], b"meta:42")
        fds, payload = recv_fds(b)
        assert payload == b"meta:42" and len(fds) == 2 and set(fds).isdisjoint({r1, r2})
        os.write(w1, b"x")
        os.write(w2, b"y")
        assert os.read(fds[0], 1) == b"x" and os.read(fds[1], 1) == b"y"
        for fd in fds:
            os.close(fd)
        send_fd(a, w1)
        fd, payload = recv_fd(b)
        assert payload == b""
        os.write(fd, b"z")
        assert os.read(r1, 1) == b"z"
        os.close(fd)
        with pytest.raises(ValueError):
            send_fds(a, [])
        send_fds(a, [r1, r2, w1])
        with pytest.raises(RuntimeError, match="truncated"):
            recv_fds(b, max_fds=1)
    finally:
        for fd in (r1, w1, r2, w2):
            os.close(fd)
        a.close()
        b.close()


def test_ipc_handle_wire_and_round_up():
    h = IpcHandle(bytes(range(64)), 4096, 1 << 20)
    assert IpcHandle.from_bytes(h.to_bytes()) == h and len(h.to_bytes()) == 80
    with pytest.raises(ValueError):
        IpcHandle(b"short", 0, 0)
    with pytest.raises(ValueError):
        IpcHandle.from_bytes(b"\0" * 10)
    assert round_up(1, 2 << 20) == 2 << 20 and round_up(4 << 20, 2 << 20) == 4 << 20
