"""Pass file descriptors between processes over a unix socket (SCM_RIGHTS).

VMM shareable handles of type POSIX_FILE_DESCRIPTOR (CUDA and HIP alike) are plain fds:
an fd number means nothing in another process, so it must travel as ancillary data; the
receiver gets its own fd for the same open file. Vendor-neutral, runs on CPU (tested).
"""
from __future__ import annotations

import os
import socket
import struct
from typing import Sequence

__all__ = ["send_fds", "recv_fds", "send_fd", "recv_fd"]

_HDR = struct.Struct("<II")  # (number of fds, payload length): the receiver checks both


def send_fds(sock: socket.socket, fds: Sequence[int], payload: bytes = b"") -> None:
    """Send `fds` (duplicated into the peer by the kernel) plus a small payload.

    The caller still owns its fds and closes them when it no longer needs them.
    """
    if not fds:
        raise ValueError("send_fds needs at least one fd")
    msg = _HDR.pack(len(fds), len(payload)) + payload
    sent = socket.send_fds(sock, [msg], list(fds))
    if sent != len(msg):  # SOCK_STREAM may send short; the fds went with the first byte
        sock.sendall(msg[sent:])


def _recv_exact(sock: socket.socket, n: int) -> bytes:
    out = b""
    while len(out) < n:
        chunk = sock.recv(n - len(out))
        if not chunk:
            raise ConnectionError(f"socket closed after {len(out)} of {n} bytes")
        out += chunk
    return out


def recv_fds(sock: socket.socket, max_fds: int = 16,
             max_payload: int = 1 << 16) -> tuple[list[int], bytes]:
    """Receive what one `send_fds` sent: (fds now owned by this process, payload)."""
    msg, fds, flags, _addr = socket.recv_fds(sock, _HDR.size + max_payload, max_fds)
    if flags & getattr(socket, "MSG_CTRUNC", 0):
        for fd in fds:
            os.close(fd)
        raise RuntimeError(f"fd message truncated: more than {max_fds} fds were sent")
    if not msg:
        raise ConnectionError("socket closed before any fd arrived")
    if len(msg) < _HDR.size:
        msg += _recv_exact(sock, _HDR.size - len(msg))
    nfds, plen = _HDR.unpack_from(msg)
    if len(fds) != nfds:
        for fd in fds:
            os.close(fd)
        raise RuntimeError(f"expected {nfds} fds, received {len(fds)}")
    body = msg[_HDR.size:]
    if len(body) < plen:
        body += _recv_exact(sock, plen - len(body))
    return list(fds), body[:plen]


def send_fd(sock: socket.socket, fd: int, payload: bytes = b"") -> None:
    send_fds(sock, [fd], payload)


def recv_fd(sock: socket.socket, max_payload: int = 1 << 16) -> tuple[int, bytes]:
    fds, payload = recv_fds(sock, 1, max_payload)
    return fds[0], payload
