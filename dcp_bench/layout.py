"""Rank layout: which sequence-parallel group shapes a world of ranks admits.

Groups are *aligned* blocks of ranks: a size that is a power of two dividing the world size and
a start that is a multiple of the size. Aligned blocks nest, so two ranks never meet in different
groups in opposite orders (collectives stay deadlock-free). Any world size works: a world of
W = m * 2^k ranks (m odd) has the degrees 1, 2, ..., 2^k, and fewer than 2W blocks (exactly 2W-1
when W is a power of two; 24 ranks = 3 nodes of 8 have degrees up to 8, 12,288 = 3 * 4,096 up
to 4,096). Plans, cluster specs, baselines and the process-group pool all take their degrees and
blocks from here.
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Any

from dcp_bench.errors import ClusterError, ConfigError, PlanError

# How a sequence-split micro-batch spreads attention over its group (`dcp_bench.plan.MicroBatch`).
SP_KINDS: tuple[str, ...] = ("ulysses", "ring", "hybrid")

# Whole-node ring or hybrid groups beyond the largest aligned group reach at most this many nodes
# (`ring_group_settings`): they serve worlds whose aligned groups are small (3 nodes: 8 GPUs).
MAX_RING_NODES = 16


def is_power_of_two(n: int) -> bool:
    return n >= 1 and (n & (n - 1)) == 0


def aligned_sp_degrees(world_size: int) -> list[int]:
    """The SP degrees 1, 2, 4, ... whose aligned groups tile ``world_size`` ranks (the powers of
    two dividing it)."""
    out, s = [], 1
    while s <= world_size and world_size % s == 0:
        out.append(s)
        s *= 2
    return out


def aligned_blocks(world_size: int) -> list[tuple[int, ...]]:
    """Every aligned block of the world, in one fixed order (size, then start): the order in
    which collective group creation must happen on every rank."""
    if world_size < 1:
        raise ClusterError(f"world size {world_size}; expected >= 1")
    return [
        tuple(range(s, s + size))
        for size in aligned_sp_degrees(world_size)
        for s in range(0, world_size, size)
    ]


def spans_nodes_cleanly(start: int, size: int, gpus_per_node: int) -> bool:
    """Whether the block [start, start+size) respects node boundaries: it lies inside one node,
    or it is made of whole nodes."""
    if size <= gpus_per_node:
        return start // gpus_per_node == (start + size - 1) // gpus_per_node
    return size % gpus_per_node == 0 and start % gpus_per_node == 0


def ulysses_span(sp_kind: str, ulysses_degree: int, group_size: int) -> int:
    """Ranks one head-sharding all-to-all of a micro-batch spans on a group of ``group_size``:
    the group (``ulysses``), 1 (``ring``), ``ulysses_degree`` (``hybrid``); the micro-batch's
    rings then have group_size / this ranks."""
    if sp_kind == "ulysses":
        return group_size
    if sp_kind == "ring":
        return 1
    if sp_kind == "hybrid":
        return ulysses_degree
    raise PlanError(f"sp_kind {sp_kind!r}; expected one of {', '.join(SP_KINDS)}")


def ring_group_settings(
    world_size: int, gpus_per_node: int, ulysses_degrees: list[int]
) -> list[tuple[int, int]]:
    """(group size, Ulysses span) of the ring and hybrid groups a world offers beside the Ulysses
    degrees ``ulysses_degrees`` (the aligned degrees the model's heads divide), ascending by size:

    * every aligned size (a power of two dividing the world) not in ``ulysses_degrees``;
    * groups of k whole nodes, k up to `MAX_RING_NODES` and the world's node count, larger than
      the largest aligned group (they start on a node boundary; any k, e.g. 3 nodes of 8).

    Each runs Ulysses over the largest of ``ulysses_degrees`` dividing its size (and, for
    whole-node groups, the node size, so every Ulysses sub-group is an aligned block of the
    process-group pool), ring attention across the sub-groups; a span of 1 is pure ring."""
    aligned = aligned_sp_degrees(world_size)
    out: list[tuple[int, int]] = []

    def span(size: int, whole_nodes: bool) -> int:
        return max(
            u
            for u in [1, *ulysses_degrees]
            if size % u == 0 and (not whole_nodes or gpus_per_node % u == 0)
        )

    for s in aligned[1:]:
        if s not in ulysses_degrees:
            out.append((s, span(s, False)))  # starts are multiples of s, so of the span
    if gpus_per_node >= 1 and world_size % gpus_per_node == 0:
        nodes = world_size // gpus_per_node
        for k in range(2, min(nodes, MAX_RING_NODES) + 1):
            s = k * gpus_per_node
            if s > aligned[-1]:
                out.append((s, span(s, True)))
    return out


def ring_group_offence(start: int, size: int, ulysses: int, world_size: int) -> str | None:
    """Why the runtime cannot run a ring or hybrid micro-batch with Ulysses span ``ulysses`` on
    the ranks [start, start + size), or None when it can. A ring needs only point-to-point
    sends (any block of ranks); a hybrid's Ulysses sub-groups of ``ulysses`` consecutive ranks
    must be aligned blocks of the process-group pool (`aligned_blocks`): ``ulysses`` a power of
    two dividing the world, the group's start a multiple of it."""
    if ulysses <= 1:
        return None
    if not (is_power_of_two(ulysses) and world_size % ulysses == 0):
        return (
            f"hybrid ulysses_degree {ulysses} is not a power of two dividing the world size "
            f"{world_size} (its sub-groups must be aligned blocks)"
        )
    if start % ulysses:
        return (
            f"hybrid Ulysses sub-groups of {ulysses} ranks from rank {start} are not aligned "
            f"(the group's start must be a multiple of {ulysses})"
        )
    return None


# Megatron-LM's recomputation settings a `ModelParallel` plan runs (`--recompute-granularity`):
# none; ``selective`` (core attention only, Korthikanti et al. 2022 section 5); ``full`` (every
# layer of a stage keeps only its input and is recomputed whole, ``--recompute-method uniform
# --recompute-num-layers 1``).
MEGATRON_RECOMPUTE: tuple[str, ...] = ("none", "selective", "full")


@dataclass(frozen=True)
class ModelParallel:
    """Megatron-style model parallelism of a plan (`dcp_bench.plan.StepPlan.model_parallel`).

    ``tp`` ranks split every layer's weights (tensor parallelism, Shoeybi et al. 2019) with
    Megatron's sequence parallelism (Korthikanti et al. 2022, section 4: the norms and dropouts
    between the tensor-parallel regions split along the sequence); ``pp`` pipeline stages of
    ``num_layers / pp`` layers each run the 1F1B schedule (Narayanan et al. 2021, PTD-P);
    ``selective``: the core attention of every layer is recomputed (Korthikanti section 5);
    ``zero_stage``: the optimizer-state sharding over the data-parallel ranks (Megatron's
    distributed optimizer is ZeRO-1). A plan group is one model replica of ``tp * pp * cp``
    ranks (``cp``: its context-parallel ring); ranks are laid out in Megatron's default order
    (tensor innermost, then context, then data, pipeline outermost), which decides which links
    each collective uses (`dcp_bench.cost.megatron`)."""

    tp: int = 1
    pp: int = 1
    sequence_parallel: bool = True
    selective: bool = False
    zero_stage: int = 1

    def offence(self, world_size: int, gpus_per_node: int, heads: int, layers: int) -> str | None:
        """Why this layout cannot run a model of ``heads`` heads and ``layers`` layers on
        ``world_size`` ranks in nodes of ``gpus_per_node``; None when it can."""
        if not (is_power_of_two(self.tp) and is_power_of_two(self.pp)):
            return f"tp={self.tp}, pp={self.pp}: expected powers of two >= 1"
        if self.tp > gpus_per_node:
            return f"tp={self.tp}: tensor parallelism stays inside a node of {gpus_per_node} GPUs"
        if heads % self.tp:
            return f"tp={self.tp}: must divide the model's {heads} attention heads"
        if layers % self.pp:
            return f"pp={self.pp}: must divide the model's {layers} layers"
        if world_size % (self.tp * self.pp):
            return f"tp*pp={self.tp * self.pp} does not divide the world of {world_size} ranks"
        if not self.sequence_parallel and self.tp > 1:
            return (
                "sequence_parallel=False: tensor parallelism without Megatron's sequence "
                "parallelism is not priced (expected sequence_parallel=True)"
            )
        if self.zero_stage not in (0, 1):
            return f"zero_stage={self.zero_stage}: Megatron's data parallelism is ZeRO 0 or 1"
        return None

    def check(self, world_size: int, gpus_per_node: int, heads: int, layers: int) -> None:
        """Raise `ConfigError` with `offence`'s words when there is one."""
        why = self.offence(world_size, gpus_per_node, heads, layers)
        if why is not None:
            raise ConfigError(f"model parallel layout: {why}")

    @property
    def model_ranks(self) -> int:
        """Ranks one context-parallel rank's model spans (``tp * pp``)."""
        return self.tp * self.pp

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> ModelParallel:
        unknown = set(data) - {f.name for f in fields(cls)}
        if unknown:
            raise ConfigError(f"model_parallel: unknown key(s) {sorted(unknown)}")
        return cls(**data)
