"""Run one function on every rank of a small local group and collect one result per rank: the
pattern of ``plan calibrate`` and the ``torch.distributed.pipelining`` reference (``plan launch``
has its own supervisor, with progress lines, results files and per-device failure messages)."""

import datetime
import multiprocessing

__all__ = ["RankFailure", "gather_from_ranks"]


class RankFailure(RuntimeError):
    """A rank reported an error or exited non-zero; the message names it."""


def gather_from_ranks(target, world: int, *, args: tuple = (), timeout_s: float = 120.0, names=None) -> dict:
    """Spawn ``target(rank, world, store_port, results, *args)`` for each rank and return
    ``{rank: payload}``. Each rank puts ``(rank, payload)`` on ``results``, or ``(rank, text)`` with
    a ``str`` text when it failed. A TCP store on a free port is the rendezvous; every process is
    joined (or killed) before this returns or raises."""
    import torch.distributed as dist

    names = names or [f"rank {r}" for r in range(world)]
    store = dist.TCPStore("127.0.0.1", 0, world + 1, True, wait_for_workers=False,
                          timeout=datetime.timedelta(seconds=timeout_s))
    context = multiprocessing.get_context("spawn")
    results = context.Queue()
    processes = [context.Process(target=target, args=(rank, world, store.port, results) + tuple(args))
                 for rank in range(world)]
    for p in processes:
        p.start()
    got = {}
    try:
        while len(got) < world:
            try:
                rank, payload = results.get(timeout=1.0)
            except Exception:  # queue.Empty
                dead = [r for r, p in enumerate(processes) if p.exitcode not in (None, 0)]
                if dead:
                    raise RankFailure(f"process {dead[0]} ({names[dead[0]]}) exited with code "
                                      f"{processes[dead[0]].exitcode}") from None
                continue
            if isinstance(payload, str):
                raise RankFailure(f"process {rank} ({names[rank]}) failed: {payload}")
            got[rank] = payload
    finally:
        finished = len(got) == world
        for p in processes:
            p.join(timeout=30 if finished else 5)
            if p.is_alive():
                p.kill()
                p.join()
    return got
