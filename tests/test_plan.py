"""The plan IR: every offence the validator must catch is caught and named; plans round-trip
through JSON."""

from __future__ import annotations

import numpy as np
import pytest

from dcp_bench.batch import GlobalBatch
from dcp_bench.cost import make_cost_model
from dcp_bench.errors import PlanError
from dcp_bench.plan import Group, MicroBatch, Round, StepPlan, validate_plan


def plan_of(
    world: int,
    groups: list[tuple[int, int, list[tuple[int, ...]]]],
    mode: str = "fair",
    ckpt: int = 0,
) -> StepPlan:
    return StepPlan(
        world_size=world,
        rounds=[
            Round(
                groups=[
                    Group(
                        start=s,
                        size=z,
                        micro_batches=[MicroBatch(samples=m, ckpt_layers=ckpt) for m in mbs],
                    )
                    for s, z, mbs in groups
                ]
            )
        ],
        mode=mode,  # type: ignore[arg-type]
    )


def test_valid_plan_passes():
    batch = GlobalBatch.from_lengths([100, 200, 300, 400])
    validate_plan(plan_of(4, [(0, 2, [(0, 1)]), (2, 1, [(2,)]), (3, 1, [(3,)])]), batch)


@pytest.mark.parametrize(
    ("groups", "mode", "pattern"),
    [
        ([(0, 4, [(0, 1, 2)])], "fair", r"missing from the plan, e.g. \[3\]"),
        ([(0, 2, [(0, 1)]), (2, 2, [(1, 2, 3)])], "fair", "sample 1 repeated"),
        ([(0, 4, [(0, 1)]), (2, 2, [(2, 3)])], "fair", "overlaps the group at rank 0 on rank 2"),
        ([(1, 2, [(0, 1, 2, 3)])], "fair", "not aligned"),
        ([(0, 8, [(0, 1, 2, 3)])], "fair", "larger than the world"),
        ([(0, 3, [(0, 1, 2, 3)])], "fair", "power of two"),
        ([(0, 4, [(0, 1, 2, 3), ()])], "fair", "empty"),
        ([(0, 4, [(0, 1, 2, 3, 4)])], "fair", "sample 4 not in batch of 4"),
        ([(0, 2, [(0, 1)])], "paper", None),  # paper mode may drop samples
    ],
)
def test_validator_names_each_offence(groups, mode, pattern):
    batch = GlobalBatch.from_lengths([100, 200, 300, 400])
    plan = plan_of(4, groups, mode)
    if pattern is None:
        validate_plan(plan, batch)
    else:
        with pytest.raises(PlanError, match=pattern):
            validate_plan(plan, batch)


def test_repeat_across_rounds_and_ckpt_range():
    batch = GlobalBatch.from_lengths([10, 20])
    plan = StepPlan(
        world_size=2,
        rounds=[
            Round(groups=[Group(0, 2, [MicroBatch((0,))])]),
            Round(groups=[Group(0, 1, [MicroBatch((0,))]), Group(1, 1, [MicroBatch((1,))])]),
        ],
    )
    with pytest.raises(
        PlanError, match=r"sample 0 repeated \(round 0, rank 0 and round 1, rank 0\)"
    ):
        validate_plan(plan, batch)
    with pytest.raises(PlanError, match="ckpt_layers=5 outside 0..4"):
        validate_plan(plan_of(2, [(0, 2, [(0, 1)])], ckpt=5), batch, num_layers=4)


def test_memory_cap_offence_uses_the_cost_model():
    cost = make_cost_model("llama3_8b", "h200x8")
    long = 1 << 19
    batch = GlobalBatch.from_lengths([long, 1000])
    # Half a million tokens on one GPU without checkpointing exceeds the cap by far ...
    bad = plan_of(8, [(0, 1, [(0,)]), (1, 1, [(1,)])])
    with pytest.raises(
        PlanError, match=r"micro-batch 0: predicted .* GiB per rank over the memory cap"
    ):
        validate_plan(bad, batch, cost)
    # ... and its memory is exactly the cost model's figure; 8-way SP with full checkpointing fits.
    mem = cost.microbatch_memory(np.array([long]), np.array([1]), 8, 32)
    assert mem <= cost.memory_cap_bytes
    ok = StepPlan(
        8, [Round([Group(0, 8, [MicroBatch((0,), 32)])]), Round([Group(0, 1, [MicroBatch((1,))])])]
    )
    validate_plan(ok, batch, cost)


def test_json_round_trip():
    plan = StepPlan(
        world_size=8,
        rounds=[
            Round(
                [
                    Group(0, 4, [MicroBatch((0, 3), 2), MicroBatch((1,), 0, "batch")]),
                    Group(4, 4, [MicroBatch((2,))]),
                ]
            ),
            Round([Group(0, 8, [MicroBatch((4,), 8)])]),
        ],
        method="static",
        mode="paper",
        step=7,
        info={"note": np.int64(3)},
    )
    back = StepPlan.from_json(plan.to_json())
    assert back.to_dict() == StepPlan.from_dict(plan.to_dict()).to_dict()
    assert back.rounds[0].groups[0].micro_batches[1].split == "batch"
    assert back.mode == "paper" and back.step == 7 and back.info == {"note": 3}
    assert sorted(back.sample_positions()) == [0, 1, 2, 3, 4]


def test_offences_are_all_listed_and_the_first_is_what_validate_raises():
    """One plan with six offences: `plan_offences` lists each (written out by hand), and
    `validate_plan` raises the first of them."""
    from dcp_bench.plan import plan_offences

    batch = GlobalBatch.from_lengths([100, 200, 300, 400, 500])
    plan = StepPlan(
        world_size=4,
        rounds=[
            Round(
                groups=[
                    Group(0, 3, [MicroBatch((0,))]),  # size 3: not a power of two
                    Group(2, 2, [MicroBatch((1, 1))]),  # sample 1 twice
                    Group(
                        2, 2, [MicroBatch((7,), ckpt_layers=9)]
                    ),  # overlaps the group at rank 2; sample 7 and ckpt out of range
                ]
            )
        ],
    )
    offences = plan_offences(plan, batch, num_layers=4)
    assert offences == [
        "round 0, group at rank 0 (size 3): group size must be a power of two (or every "
        "micro-batch of it ring or hybrid: any block of ranks)",
        "sample 1 repeated (round 0, rank 2 and round 0, rank 2)",
        "round 0, group at rank 2 (size 2): overlaps the group at rank 2 on rank 2",
        "round 0, group at rank 2 (size 2), micro-batch 0: ckpt_layers=9 outside 0..4",
        "round 0, group at rank 2 (size 2), micro-batch 0: sample 7 not in batch of 5",
        "fair mode: 3 sample(s) missing from the plan, e.g. [2, 3, 4]",
    ]
    with pytest.raises(PlanError) as exc:
        validate_plan(plan, batch, num_layers=4)
    assert str(exc.value) == offences[0]


def test_valid_plan_has_no_offences():
    from dcp_bench.plan import plan_offences

    batch = GlobalBatch.from_lengths([100, 200, 300, 400])
    assert (
        plan_offences(plan_of(4, [(0, 2, [(0, 1)]), (2, 1, [(2,)]), (3, 1, [(3,)])]), batch) == []
    )
