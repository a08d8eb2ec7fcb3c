"""exchange_fds with threads as ranks: every rank gets every peer's open file."""
import os
import tempfile
import threading

from peerdsl.runtime.cuda.fdexchange import exchange_fds


def test_every_rank_gets_every_peers_fd():
    world = 4
    files = []
    for r in range(world):
        f = tempfile.TemporaryFile()
        f.write(f"rank {r}".encode())
        f.flush()
        files.append(f)
    gathered: dict = {}
    cond = threading.Condition()

    def all_gather_object(out, obj, rank):
        with cond:
            gathered[rank] = obj
            cond.notify_all()
            cond.wait_for(lambda: len(gathered) == world, timeout=10)
        out[:] = [gathered[r] for r in range(world)]

    results = [None] * world

    def rank_main(r):
        results[r] = exchange_fds(files[r].fileno(), r, world,
                                  lambda out, obj: all_gather_object(out, obj, r), timeout_s=10)

    threads = [threading.Thread(target=rank_main, args=(r,)) for r in range(world)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(20)
    for r, fds in enumerate(results):
        assert fds[r] is None
        for peer, fd in enumerate(fds):
            if peer != r:
                assert os.pread(fd, 16, 0) == f"rank {peer}".encode()
                os.close(fd)
