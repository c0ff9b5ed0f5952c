"""A sweep as a torch.distributed job: which rank owns which point, and the few collectives a sweep needs.

``torchrun --nnodes N --nproc-per-node G -m cute_kernels sweep ...`` starts one process per GPU with
``RANK``, ``WORLD_SIZE`` and ``LOCAL_RANK`` set; without them (a plain ``python -m cute_kernels sweep``) the
sweep is one rank of one. Each rank owns the points whose stable hash lands on it (:func:`owner`), so a
restarted job gives every rank the same share. The collectives run over gloo: they carry Python rows (a
handful of bytes per point, once per round), which gloo moves between CPUs on any host, GPU or not (so CI's
2-process compile-only sweep runs them too).
"""

from __future__ import annotations

import dataclasses
import datetime
import hashlib
import os
import time

__all__ = ["Ranks", "JobCounter", "owner", "share"]

# A sweep's ranks wait for each other at the end of every round, and a round of CuTe compiles and timings
# can take many minutes on one rank while another has finished its share: far past gloo's default of 30.
_COLLECTIVE_TIMEOUT = datetime.timedelta(hours=12)


def owner(key: tuple, world: int) -> int:
    """The rank (0 .. world-1) that runs the point of ``key``: a stable hash (sha256 of its repr, the same in
    every process and on every host, unlike ``hash()``) modulo the world size."""
    digest = hashlib.sha256(repr(key).encode()).digest()
    return int.from_bytes(digest[:8], "big") % world


def share(points: list, rank: int, world: int) -> list:
    """The points ``rank`` owns, in their planned order (each point's ``key()`` decides)."""
    return [p for p in points if owner(p.key(), world) == rank]


@dataclasses.dataclass(frozen=True)
class Ranks:
    """This process's place in the job: ``rank`` of ``world`` processes, ``local_rank`` on its host (the
    GPU it times on). ``distributed``: started by torchrun (then the process group is gloo)."""

    rank: int = 0
    world: int = 1
    local_rank: int = 0
    distributed: bool = False

    @classmethod
    def from_env(cls) -> "Ranks":
        """torchrun's environment, or one rank of one."""
        if "RANK" not in os.environ or "WORLD_SIZE" not in os.environ:
            return cls()
        return cls(int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"]), int(os.environ.get("LOCAL_RANK", 0)),
                   True)

    def start(self) -> None:
        """Join the job's process group (gloo, rendezvous from torchrun's environment)."""
        if self.distributed:
            import torch.distributed as dist

            if not dist.is_initialized():
                dist.init_process_group("gloo", timeout=_COLLECTIVE_TIMEOUT)

    def stop(self) -> None:
        if self.distributed:
            import torch.distributed as dist

            if dist.is_initialized():
                dist.destroy_process_group()

    def broadcast(self, value):
        """Rank 0's ``value``, on every rank."""
        if not self.distributed:
            return value
        import torch.distributed as dist

        box = [value if self.rank == 0 else None]
        dist.broadcast_object_list(box, src=0)
        return box[0]

    def counter(self, name: str) -> "JobCounter | None":
        """A count every rank adds to and any rank reads at once (the job's key-value store, which
        torch.distributed's rendezvous set up), named ``name`` plus a key rank 0 chose for this run; None
        for a single rank, or where the store cannot be reached (then progress moves with the rounds)."""
        if not self.distributed:
            return None
        # The collective first, on every rank alike, whatever the store lookup below finds.
        run = self.broadcast(f"{os.getpid()}-{time.time_ns()}" if self.rank == 0 else None)
        try:
            from torch.distributed import distributed_c10d

            store = distributed_c10d._get_default_store()
        except Exception:  # noqa: BLE001 - a private torch API: without it the bar moves per round
            return None
        return JobCounter(store, f"cute_kernels/{name}/{run}")

    def gather(self, rows: list) -> list:
        """Every rank's ``rows`` concatenated on rank 0 (in rank order); an empty list elsewhere."""
        if not self.distributed:
            return list(rows)
        import torch.distributed as dist

        parts = [None] * self.world if self.rank == 0 else None
        dist.gather_object(rows, parts, dst=0)
        return [row for part in parts for row in part] if self.rank == 0 else []


class JobCounter:
    """One number in the job's store: ``add(n)`` from any rank, ``value()`` read from any rank (the store's
    atomic add, so no rank waits for another)."""

    def __init__(self, store, key: str):
        self.store, self.key = store, key

    def add(self, n: int = 1) -> int:
        return int(self.store.add(self.key, n))

    def value(self) -> int:
        return self.add(0)
