"""Pure checks of the group layout and the batch-split dealing (no processes)."""

from __future__ import annotations

import numpy as np
import pytest

from dcp_bench.errors import ClusterError
from dcp_bench.layout import aligned_blocks as aligned_groups
from dcp_bench.runtime.executor import deal_samples


@pytest.mark.parametrize("world", [1, 2, 4, 8, 32])
def test_aligned_groups_are_every_aligned_power_of_two_block(world: int) -> None:
    groups = aligned_groups(world)
    # Brute force: every (start, size) with size a power of two dividing start, inside the world.
    expected = {
        tuple(range(s, s + z))
        for z in (1 << k for k in range(world.bit_length()))
        for s in range(0, world, z)
        if z <= world
    }
    assert set(groups) == expected
    assert len(groups) == len(set(groups)) == 2 * world - 1


@pytest.mark.parametrize("world", [3, 6, 12, 24])
def test_any_world_has_the_blocks_whose_size_divides_it(world: int) -> None:
    # Brute force: every (start, size) with size a power of two dividing the world, start a
    # multiple of size.
    expected = {
        tuple(range(s, s + z))
        for z in (1 << k for k in range(world.bit_length()))
        if world % z == 0
        for s in range(0, world, z)
    }
    assert set(aligned_groups(world)) == expected
    with pytest.raises(ClusterError, match="world size 0"):
        aligned_groups(0)


def test_deal_partitions_samples_and_balances_like_lpt() -> None:
    rng = np.random.default_rng(0)
    tokens = rng.integers(1, 1000, size=23)
    positions = list(range(23))
    parts = deal_samples(positions, tokens, 4)
    assert sorted(p for part in parts for p in part) == positions
    loads = [int(tokens[part].sum()) for part in parts]
    # LPT's guarantee: no rank exceeds the mean load by more than the largest item.
    assert max(loads) <= tokens.sum() / 4 + tokens.max()
    for part in parts:  # plan order is kept within a rank
        assert part == sorted(part)
