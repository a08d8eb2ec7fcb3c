"""[GPU] Two-process self-test of the sharing helpers: CUDA IPC and VMM fds over SCM_RIGHTS.

The parent allocates and fills, a child process (this module run with --child, driver
only, no torch) opens/imports the memory, checks what it reads and overwrites it; the
parent then checks the child's writes. Used by scripts/gpu_proof_loader.py:

    run_ipc_selftest(device)  torch allocation at an offset -> ipc_export -> child ipc_open
    run_vmm_selftest(device)  vmm_alloc -> export fd -> send_fd -> child import + map
"""
from __future__ import annotations

import array
import json
import os
import socket
import struct
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any

from ._driver import check, driver
from .fdpass import recv_fd, send_fd
from .ipc import IpcHandle, ipc_close, ipc_export, ipc_open
from .loader import ensure_context
from .vmm import vmm_alloc, vmm_export_fd, vmm_free, vmm_import_fd

_LEN = struct.Struct("<I")


def _send(sock: socket.socket, obj: Any) -> None:
    data = json.dumps(obj).encode()
    sock.sendall(_LEN.pack(len(data)) + data)


def _recv(sock: socket.socket) -> Any:
    def exact(n: int) -> bytes:
        out = b""
        while len(out) < n:
            chunk = sock.recv(n - len(out))
            if not chunk:
                raise ConnectionError("peer closed the socket")
            out += chunk
        return out
    return json.loads(exact(_LEN.unpack(exact(_LEN.size))[0]))


def _read_u32(ptr: int, n: int) -> list[int]:
    host = bytearray(4 * n)
    check(driver().cuMemcpyDtoH(host, ptr, 4 * n), "cuMemcpyDtoH")
    return array.array("I", bytes(host)).tolist()


def _fill(ptr: int, value: int, n: int) -> None:
    drv = driver()
    check(drv.cuMemsetD32(ptr, value, n), "cuMemsetD32")
    check(drv.cuCtxSynchronize(), "cuCtxSynchronize")


def _child(fd: int, device: int) -> int:
    sock = socket.socket(fileno=fd)
    try:
        ensure_context(device)
        setup_error = ""
    except Exception as e:  # e.g. no driver: answer every request with the reason
        setup_error = f"child setup: {type(e).__name__}: {e}"
    while True:
        msg = _recv(sock)
        if msg["kind"] == "quit":
            return 0
        try:
            if setup_error:
                if msg["kind"] == "vmm":
                    os.close(recv_fd(sock)[0])
                raise RuntimeError(setup_error)
            if msg["kind"] == "ipc":
                ptr = ipc_open(IpcHandle.from_bytes(bytes.fromhex(msg["handle"])), device=device)
                got = _read_u32(ptr, msg["n"])
                _fill(ptr, msg["write"], msg["n"])
                ipc_close(ptr)
            else:
                vfd, _ = recv_fd(sock)
                alloc = vmm_import_fd(vfd, msg["size"], device)
                os.close(vfd)  # the imported handle keeps the memory alive
                got = _read_u32(alloc.ptr, msg["n"])
                _fill(alloc.ptr, msg["write"], msg["n"])
                vmm_free(alloc)
            ok = got == msg["expect"]
            _send(sock, {"ok": ok, "detail": "read what the parent wrote" if ok else
                         f"read {got[:4]}... expected {msg['expect'][:4]}..."})
        except Exception as e:  # report to the parent rather than dying silently
            detail = str(e) if setup_error else f"{type(e).__name__}: {e}"
            _send(sock, {"ok": False, "detail": detail})


class _Child:
    """The peer: a process running `_child` (or, for CPU tests with a fake driver, a thread)."""

    def __init__(self, device: int, in_thread: bool = False):
        self.sock, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.settimeout(120)
        self.proc: Any = None
        if in_thread:
            self.thread = threading.Thread(target=_child, args=(theirs.detach(), device),
                                           daemon=True)
            self.thread.start()
            return
        root = str(Path(__file__).resolve().parents[3])
        env = dict(os.environ, PYTHONPATH=os.pathsep.join(
            [root] + [p for p in [os.environ.get("PYTHONPATH")] if p]))
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "peerdsl.runtime.cuda.selftest", "--child",
             str(theirs.fileno()), str(device)], pass_fds=[theirs.fileno()], env=env)
        theirs.close()

    def ask(self, msg: dict[str, Any], fd: int | None = None) -> dict[str, Any]:
        _send(self.sock, msg)
        if fd is not None:
            send_fd(self.sock, fd)
        return _recv(self.sock)

    def close(self) -> None:
        try:
            _send(self.sock, {"kind": "quit"})
            if self.proc is not None:
                self.proc.wait(timeout=60)
            else:
                self.thread.join(timeout=60)
        finally:
            if self.proc is not None and self.proc.poll() is None:
                self.proc.kill()
            self.sock.close()


def run_ipc_selftest(device: int) -> str:
    """A torch buffer, shared from an offset inside its allocation, written by the child."""
    import torch
    base = torch.arange(4096, dtype=torch.int32, device=f"cuda:{device}")
    part = base[1024:2048]
    torch.cuda.synchronize(device)
    h = ipc_export(part, device=device)
    child = _Child(device)
    try:
        r = child.ask({"kind": "ipc", "handle": h.to_bytes().hex(), "n": 1024,
                       "expect": list(range(1024, 2048)), "write": 0xABCD})
    finally:
        child.close()
    if not r["ok"]:
        raise AssertionError(f"child: {r['detail']}")
    torch.cuda.synchronize(device)
    if not bool((part == 0xABCD).all()) or not bool((base[:1024] == torch.arange(
            1024, device=base.device, dtype=torch.int32)).all()):
        raise AssertionError("parent does not see exactly the child's writes")
    return f"offset {h.offset} in a torch allocation: child read it, parent saw its writes"


def run_vmm_selftest(device: int, *, in_thread: bool = False) -> str:
    """A VMM allocation passed as an fd over a unix socket, imported and mapped by the child."""
    alloc = vmm_alloc(1 << 20, device)
    n = alloc.size // 4
    try:
        _fill(alloc.ptr, 7, n)
        fd = vmm_export_fd(alloc)
        child = _Child(device, in_thread)
        try:
            r = child.ask({"kind": "vmm", "size": alloc.size, "n": 256, "expect": [7] * 256,
                           "write": 9}, fd=fd)
        finally:
            os.close(fd)
            child.close()
        if not r["ok"]:
            raise AssertionError(f"child: {r['detail']}")
        got = _read_u32(alloc.ptr, 257)
        if got[:256] != [9] * 256 or got[256] != 7:
            raise AssertionError(f"parent read {got[:2]}..{got[255:257]} after the child wrote 9s")
    finally:
        vmm_free(alloc)
    return f"{alloc.size} B VMM allocation shared by fd: child read 7s, parent saw its 9s"


if __name__ == "__main__" and len(sys.argv) == 4 and sys.argv[1] == "--child":
    sys.exit(_child(int(sys.argv[2]), int(sys.argv[3])))
