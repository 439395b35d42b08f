"""`ProcessGroupPool`: every aligned power-of-two group of ranks, created once.

A plan's groups are aligned blocks (size a power of two dividing the world, start a multiple of
the size), so a world of W ranks needs fewer than 2W groups: W singletons, W/2 pairs, ... (the
world itself among them when W is a power of two; 6 ranks have singletons and 3 pairs).
``torch.distributed.new_group`` is collective and must be called in the same order on every rank
(a different order silently pairs the wrong ranks), so the pool creates all of them up front, in
one fixed order, with a timeout. Lookup is by rank tuple; nothing holds a "current group".
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import torch.distributed as dist

from dcp_bench.errors import PlanError
from dcp_bench.layout import aligned_blocks
from dcp_bench.runtime.attention import SPContext


class ProcessGroupPool:
    """Process groups for every aligned block of ranks. Construct it on every rank after
    ``init_process_group``; ``get(ranks)`` returns the group (None for a single rank)."""

    def __init__(self, timeout_s: float = 300.0, backend: str | None = None) -> None:
        if not dist.is_initialized():
            raise RuntimeError("ProcessGroupPool needs torch.distributed to be initialised")
        self.world_size = dist.get_world_size()
        self.rank = dist.get_rank()
        self.timeout = timedelta(seconds=timeout_s)
        self._groups: dict[tuple[int, ...], Any] = {}
        for ranks in aligned_blocks(self.world_size):
            if len(ranks) == 1:
                continue  # a group of one needs no communicator
            if len(ranks) == self.world_size:
                self._groups[ranks] = dist.group.WORLD
                continue
            # Every rank calls new_group for every block, members or not: it is collective.
            self._groups[ranks] = dist.new_group(list(ranks), timeout=self.timeout, backend=backend)

    def __len__(self) -> int:
        return len(aligned_blocks(self.world_size))

    def get(self, ranks: tuple[int, ...] | range) -> Any:
        key = tuple(ranks)
        if len(key) == 1:
            return None
        if key not in self._groups:
            raise PlanError(
                f"no process group for ranks {key}: groups must be aligned power-of-two blocks "
                f"whose size divides the world of {self.world_size}"
            )
        return self._groups[key]

    def context(
        self, start: int, size: int, kind: str = "ulysses", ulysses_degree: int = 0
    ) -> SPContext:
        """The SP context of this rank in the group [start, start+size) for attention ``kind``
        (`dcp_bench.runtime.attention.SP_KINDS`). Ulysses needs the group's process group (an
        aligned block). Ring needs none (point-to-point between global ranks), so a ring runs on
        any block of ranks, e.g. 3 or 24. Hybrid needs the process group of each Ulysses
        sub-group of ``ulysses_degree`` consecutive ranks (aligned blocks)."""
        if not start <= self.rank < start + size:
            raise PlanError(f"rank {self.rank} is not in the group {start}..{start + size - 1}")
        rank = self.rank - start
        if kind == "ring":
            return SPContext(
                size=size,
                rank=rank,
                group=self._groups.get(tuple(range(start, start + size))),
                kind="ring",
                ring_ranks=tuple(range(start, start + size)),
            )
        if kind == "hybrid":
            u = ulysses_degree
            if not 1 < u < size or size % u:
                raise PlanError(
                    f"hybrid SP on {size} ranks with Ulysses degree {u}: it must divide the "
                    "group size and lie strictly between 1 and it"
                )
            sub = start + (rank // u) * u
            return SPContext(
                size=size,
                rank=rank,
                group=self._groups.get(tuple(range(start, start + size))),
                kind="hybrid",
                ulysses_size=u,
                ulysses_group=self.get(range(sub, sub + u)),
                ring_ranks=tuple(start + rank % u + j * u for j in range(size // u)),
            )
        return SPContext(size=size, rank=rank, group=self.get(range(start, start + size)))
