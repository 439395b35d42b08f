"""Multi-process (gloo) checks of the executor: whatever the plan, the loss and the gradients of one
global batch equal a single-process reference; recompute does not change them; reruns are
bitwise identical.

Spawning is expensive here (seconds per process), so one set of 4 processes runs every scenario
once (module-scoped fixture) and the tests check the stored results.
"""

from __future__ import annotations

import dataclasses
import os
import socket
import tempfile
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
import torch.multiprocessing as mp

from dcp_bench.batch import GlobalBatch
from dcp_bench.cost.specs import model_spec
from dcp_bench.plan import Group, MicroBatch, Round, StepPlan, validate_plan
from dcp_bench.runtime.attention import SINGLE
from dcp_bench.runtime.models import build_model


def flat_grads(model: torch.nn.Module) -> torch.Tensor:
    """All gradients in parameter order (zeros for a parameter without one)."""
    return torch.cat(
        [
            (torch.zeros_like(p) if p.grad is None else p.grad).reshape(-1)
            for p in model.parameters()
        ]
    )


pytestmark = pytest.mark.dist

WORLD = 4
SEED = 7
TEXT = GlobalBatch(
    step=0,
    sample_ids=np.array([11, 12, 13, 14, 15, 16, 17], dtype=np.int64),
    tokens=np.array([37, 121, 64, 9, 203, 50, 18], dtype=np.int64),
    frames=np.ones(7, dtype=np.int64),
)
# Video: (frames, spatial) with uneven sizes so DSP has to pad both dimensions.
VIDEO = GlobalBatch(
    step=0,
    sample_ids=np.array([21, 22, 23, 24, 25], dtype=np.int64),
    tokens=np.array([5 * 9, 3 * 6, 1 * 16, 8 * 12, 2 * 4], dtype=np.int64),
    frames=np.array([5, 3, 1, 8, 2], dtype=np.int64),
)


def mb(*samples: int, ckpt: int = 0, split: str = "sequence") -> MicroBatch:
    return MicroBatch(samples=tuple(samples), ckpt_layers=ckpt, split=split)  # type: ignore[arg-type]


def plan_of(rounds: list[list[tuple[int, int, list[MicroBatch]]]], mode: str = "fair") -> StepPlan:
    return StepPlan(
        world_size=WORLD,
        rounds=[
            Round(groups=[Group(start=s, size=z, micro_batches=m) for s, z, m in rnd])
            for rnd in rounds
        ],
        mode=mode,  # type: ignore[arg-type]
    )


def text_plans(ckpt: int) -> dict[str, StepPlan]:
    return {
        "static_sp4": plan_of([[(0, 4, [mb(0, 1, 2, ckpt=ckpt), mb(3, 4, 5, 6, ckpt=ckpt)])]]),
        "static_sp2": plan_of(
            [[(0, 2, [mb(0, 1, ckpt=ckpt), mb(2, 3)]), (2, 2, [mb(4, ckpt=ckpt), mb(5, 6)])]]
        ),
        "inter_unequal": plan_of(
            [
                [
                    (0, 2, [mb(4, ckpt=ckpt)]),
                    (2, 1, [mb(1), mb(3, 6, ckpt=ckpt)]),
                    (3, 1, [mb(0, 2), mb(5)]),
                ]
            ]
        ),
        "multi_round": plan_of(
            [
                [(0, 4, [mb(4, ckpt=ckpt)])],
                [
                    (0, 1, [mb(0)]),
                    (1, 1, [mb(1, ckpt=ckpt)]),
                    (2, 2, [mb(2, 3, 5)]),
                ],
            ]
            + [[(3, 1, [mb(6)])]]
        ),
        "split_batch": plan_of(
            [[(0, 4, [mb(0, 1, 2, 3, 5, split="batch", ckpt=ckpt), mb(4, 6, ckpt=ckpt)])]]
        ),
        # the same rounds with every rank waiting at each round's end (Megatron's barrier)
        "multi_round_barrier": dataclasses.replace(
            plan_of(
                [
                    [(0, 4, [mb(4, ckpt=ckpt)])],
                    [
                        (0, 1, [mb(0)]),
                        (1, 1, [mb(1, ckpt=ckpt)]),
                        (2, 2, [mb(2, 3, 5)]),
                    ],
                ]
                + [[(3, 1, [mb(6)])]]
            ),
            round_barrier=True,
        ),
    }


def video_plans(ckpt: int) -> dict[str, StepPlan]:
    return {
        "dsp_sp4": plan_of([[(0, 4, [mb(0, 1, 2, ckpt=ckpt), mb(3, 4, ckpt=ckpt)])]]),
        "dsp_mixed": plan_of(
            [[(0, 2, [mb(3, ckpt=ckpt), mb(0)]), (2, 1, [mb(1, 2)]), (3, 1, [mb(4, ckpt=ckpt)])]]
        ),
    }


HAND: list[tuple[str, str, str, int]] = (
    [("tiny_llama", name, "text", 0) for name in text_plans(0)]
    + [("tiny_llama", name, "text", 2) for name in ("static_sp4", "inter_unequal", "multi_round")]
    + [("tiny_llama", "static_sp4", "text", 4)]
    + [("tiny_stdit", name, "video", 0) for name in video_plans(0)]
    + [("tiny_stdit", "dsp_sp4", "video", 2)]
    + [("tiny_llama", "static_sp4", "text", 0)]  # rerun: bitwise determinism
)


def hand_cases() -> list[tuple[str, str, GlobalBatch, StepPlan]]:
    """(label, model, batch, plan) for every hand-built plan."""
    out = []
    for model_name, plan_name, kind, ckpt in HAND:
        batch = TEXT if kind == "text" else VIDEO
        out.append(
            (
                f"{model_name}-{plan_name}-ckpt{ckpt}",
                model_name,
                batch,
                _plans(kind, ckpt)[plan_name],
            )
        )
    return out


def _plans(kind: str, ckpt: int) -> dict[str, StepPlan]:
    return text_plans(ckpt) if kind == "text" else video_plans(ckpt)


def _worker(rank: int, port: int, out_dir: str, cases: list[tuple[Any, ...]]) -> None:
    """Each case: (label, model, batch, plan) runs the replicated path with the gradients left in
    ``.grad``; a fifth element names a ZeRO stage (`build_training_state`)."""
    import torch.distributed as dist

    from dcp_bench.runtime.executor import execute_step
    from dcp_bench.runtime.groups import ProcessGroupPool
    from dcp_bench.runtime.training import build_training_state

    torch.set_num_threads(1)
    os.environ["MASTER_ADDR"] = "127.0.0.1"
    os.environ["MASTER_PORT"] = str(port)
    dist.init_process_group("gloo", rank=rank, world_size=WORLD)
    try:
        pool = ProcessGroupPool(timeout_s=60)
        results = []
        for case in cases:
            _, model_name, batch, plan = case[:4]
            if len(case) > 4:
                state = build_training_state(
                    model_spec(model_name), SEED, torch.device("cpu"), 1e-3, zero_stage=case[4]
                )
                res = execute_step(plan, batch, state, None, pool, seed=SEED, update=False)
                grads = state.gradients()
            else:
                model = build_model(model_spec(model_name), seed=SEED)
                res = execute_step(plan, batch, model, None, pool, seed=SEED)
                grads = flat_grads(model)
            results.append(
                {
                    "loss": res.loss,
                    "grad_norm": res.grad_norm,
                    "grads": grads,
                    "mbs": res.micro_batches,
                }
            )
        torch.save(results, Path(out_dir) / f"rank{rank}.pt")
    finally:
        dist.destroy_process_group()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def reference_step(model: torch.nn.Module, batch: GlobalBatch) -> float:
    """Single process, one sample at a time, no padding, loss normalised by the batch's tokens;
    gradients accumulate in ``.grad``. Returns the loss."""
    total = 0.0
    for i in range(batch.n):
        sl = slice(i, i + 1)
        inputs = model.make_inputs(
            batch.sample_ids[sl], batch.tokens[sl], batch.frames[sl], SINGLE, SEED
        )  # type: ignore[operator]
        loss = model.loss_sum(inputs) / batch.total_tokens  # type: ignore[operator]
        loss.backward()
        total += float(loss.detach())
    return total


_REFERENCES: dict[tuple[str, str], tuple[float, torch.Tensor]] = {}


def reference(model_name: str, batch: GlobalBatch, key: str) -> tuple[float, torch.Tensor]:
    """Loss and gradient of one step from a fresh model (cached per model and batch key)."""
    if (model_name, key) not in _REFERENCES:
        model = build_model(model_spec(model_name), seed=SEED)
        loss = reference_step(model, batch)
        _REFERENCES[(model_name, key)] = (loss, flat_grads(model))
    return _REFERENCES[(model_name, key)]


def run_cases(cases: list[tuple[Any, ...]]) -> list[list[dict[str, Any]]]:
    """Run every case on one set of WORLD spawned processes; results per rank, per case."""
    with tempfile.TemporaryDirectory() as tmp:
        mp.spawn(_worker, args=(_free_port(), tmp, cases), nprocs=WORLD, join=True)
        return [torch.load(Path(tmp) / f"rank{r}.pt") for r in range(WORLD)]


# Paper mode: the plan drops samples 3, 5 and 6; the loss is normalised by the covered tokens.
PAPER_KEEP = [0, 1, 2, 4]
PAPER_PLAN = plan_of([[(0, 2, [mb(0, 1)]), (2, 2, [mb(2, 4, ckpt=1)])]], mode="paper")
CASES = [*hand_cases(), ("tiny_llama-paper_mode_drops", "tiny_llama", TEXT, PAPER_PLAN)]
LABELS = [c[0] for c in CASES]


@pytest.fixture(scope="module")
def dist_results() -> list[list[dict[str, Any]]]:
    return run_cases(CASES)


def rel_l2(a: torch.Tensor, b: torch.Tensor) -> float:
    return float(torch.linalg.vector_norm(a - b) / torch.linalg.vector_norm(b))


def test_hand_plans_are_valid() -> None:
    for kind, batch in (("text", TEXT), ("video", VIDEO)):
        for ckpt in (0, 2):
            for plan in _plans(kind, ckpt).values():
                validate_plan(plan, batch, num_layers=4)


@pytest.mark.parametrize("index", range(len(CASES)), ids=LABELS)
def test_plan_matches_single_process(dist_results: list[list[dict[str, Any]]], index: int) -> None:
    label, model_name, batch, _ = CASES[index]
    if label.endswith("paper_mode_drops"):
        # Independent reference: single-device training on the samples the plan keeps.
        ref_loss, ref_grads = reference(model_name, batch.subset(PAPER_KEEP), "text-paper")
    else:
        ref_loss, ref_grads = reference(model_name, batch, "text" if batch is TEXT else "video")
    for rank in range(WORLD):
        got = dist_results[rank][index]
        assert abs(got["loss"] - ref_loss) <= 1e-5 * abs(ref_loss)
        assert rel_l2(got["grads"], ref_grads) <= 1e-5
    # The all-reduce leaves every rank with the same gradient.
    for rank in range(1, WORLD):
        assert torch.equal(dist_results[rank][index]["grads"], dist_results[0][index]["grads"])


def test_every_rank_worked_somewhere(dist_results: list[list[dict[str, Any]]]) -> None:
    # Guards the scenarios themselves: a plan where some rank never ran would test less.
    for index, (_, plan_name, _, _) in enumerate(HAND):
        if plan_name in (
            "static_sp4",
            "dsp_sp4",
            "split_batch",
            "static_sp2",
            "inter_unequal",
            "dsp_mixed",
        ):
            assert all(dist_results[r][index]["mbs"] > 0 for r in range(WORLD))


def test_recompute_does_not_change_gradients(dist_results: list[list[dict[str, Any]]]) -> None:
    by_key = {(m, p, c): i for i, (m, p, _, c) in enumerate(HAND)}
    for (m, p, c), i in by_key.items():
        if c == 0 or (m, p, 0) not in by_key:
            continue
        base = dist_results[0][by_key[(m, p, 0)]]
        ck = dist_results[0][i]
        assert rel_l2(ck["grads"], base["grads"]) <= 1e-6
        assert abs(ck["loss"] - base["loss"]) <= 1e-6 * abs(base["loss"])


def test_rerun_is_bitwise_identical(dist_results: list[list[dict[str, Any]]]) -> None:
    first, again = 0, len(HAND) - 1
    assert HAND[first] == HAND[again]
    for rank in range(WORLD):
        assert dist_results[rank][first]["loss"] == dist_results[rank][again]["loss"]
        assert torch.equal(dist_results[rank][first]["grads"], dist_results[rank][again]["grads"])
