"""Rank layout: which sequence-parallel group shapes a world of ranks admits.

Groups are *aligned* blocks of ranks: a size that is a power of two and a start that is a
multiple of the size. Aligned blocks nest, so two ranks never meet in different groups in
opposite orders (collectives stay deadlock-free), and a world of W ranks (W a power of two) has
exactly 2W-1 of them. Plans, cluster specs, baselines and the process-group pool all take their
degrees and blocks from here.
"""

from __future__ import annotations

from dcp_bench.errors import ClusterError


def is_power_of_two(n: int) -> bool:
    return n >= 1 and (n & (n - 1)) == 0


def aligned_sp_degrees(world_size: int) -> list[int]:
    """The SP degrees 1, 2, 4, ... whose aligned groups tile ``world_size`` ranks."""
    out, s = [], 1
    while s <= world_size and world_size % s == 0:
        out.append(s)
        s *= 2
    return out


def require_power_of_two(world_size: int, what: str = "world size") -> None:
    """Raise `ClusterError` unless ``world_size`` is a power of two (aligned groups tile it)."""
    if not is_power_of_two(world_size):
        raise ClusterError(
            f"{what} {world_size} is not a power of two; aligned sequence-parallel groups "
            "(1, 2, 4, ...) cannot tile it"
        )


def aligned_blocks(world_size: int) -> list[tuple[int, ...]]:
    """Every aligned block of the world, in one fixed order (size, then start): the order in
    which collective group creation must happen on every rank."""
    require_power_of_two(world_size)
    out: list[tuple[int, ...]] = []
    size = 1
    while size <= world_size:
        out.extend(tuple(range(s, s + size)) for s in range(0, world_size, size))
        size *= 2
    return out
