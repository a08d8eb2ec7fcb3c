"""Every rank's file descriptor to every other rank, over unix sockets (SCM_RIGHTS).

An fd number means nothing in another process, so VMM allocations exported as POSIX fds
travel as ancillary data. Each rank listens on a socket in a temp directory, publishes the
path through the process group (`all_gather_object`), serves its fd to each peer, and fetches
each peer's. Vendor-neutral; runs on the CPU (tested with threads as ranks).
"""
from __future__ import annotations

import os
import socket
import tempfile
import threading
import uuid
from typing import Any, Callable

from .fdpass import recv_fd, send_fd

__all__ = ["exchange_fds"]


def exchange_fds(fd: int, rank: int, world: int,
                 all_gather_object: Callable[[list, Any], None],
                 timeout_s: float = 60.0) -> list[int | None]:
    """fds of every rank's object, owned by this process (None at this rank's index).

    `all_gather_object(out_list, obj)` is the process group's all-gather. The caller closes
    the returned fds once it has imported them.
    """
    path = os.path.join(tempfile.gettempdir(), f"peerdsl-{uuid.uuid4().hex}-{rank}.sock")
    server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    server.bind(path)
    server.listen(max(1, world - 1))
    server.settimeout(timeout_s)
    errors: list[BaseException] = []

    def serve() -> None:
        try:
            for _ in range(world - 1):
                conn, _ = server.accept()
                with conn:
                    send_fd(conn, fd, rank.to_bytes(4, "little"))
        except BaseException as e:  # noqa: BLE001 - re-raised on the caller's thread
            errors.append(e)

    server_thread = threading.Thread(target=serve, daemon=True)
    server_thread.start()
    try:
        paths: list[Any] = [None] * world
        all_gather_object(paths, path)
        fds: list[int | None] = [None] * world
        for peer in range(world):
            if peer == rank:
                continue
            with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
                s.settimeout(timeout_s)
                s.connect(paths[peer])
                got, payload = recv_fd(s)
                if int.from_bytes(payload, "little") != peer:
                    os.close(got)
                    raise RuntimeError(f"rank {rank}: the socket of rank {peer} answered as "
                                       f"rank {int.from_bytes(payload, 'little')}")
                fds[peer] = got
        server_thread.join(timeout_s)
        if errors:
            raise RuntimeError(f"rank {rank}: serving its fd failed: {errors[0]!r}")
        if server_thread.is_alive():
            raise TimeoutError(f"rank {rank}: peers did not fetch its fd in {timeout_s} s")
        return fds
    finally:
        server.close()
        if os.path.exists(path):
            os.unlink(path)
