"""Sharded training states on 4 gloo ranks (fp32): every ZeRO stage's reduced gradient equals the
single-process reference for plans with unequal groups, several rounds, batch splits, recompute
and DSP (FSDP stages with their lockstep empty passes); a few AdamW steps of a sharded state equal
single-process AdamW training; the state's bytes equal what `dcp_bench.train_policy` (the cost
models' source) says it holds; the lockstep pass count pads every rank of a round to the same
number of passes.

One spawn of 4 processes runs every scenario (module-scoped fixture).
"""

from __future__ import annotations

import dataclasses
import os
import tempfile
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
import torch.multiprocessing as mp
from test_runtime_dist import (
    SEED,
    TEXT,
    VIDEO,
    WORLD,
    _free_port,
    mb,
    plan_of,
    reference,
    reference_step,
    rel_l2,
    text_plans,
    video_plans,
)

from dcp_bench.batch import GlobalBatch
from dcp_bench.cost.params import param_breakdown
from dcp_bench.cost.specs import ModelSpec, model_spec
from dcp_bench.plan import StepPlan
from dcp_bench.runtime.executor import round_pass_counts
from dcp_bench.runtime.models import build_model
from dcp_bench.train_policy import precision_policy, static_state_bytes

pytestmark = pytest.mark.dist

# (label, model, batch, plan, ZeRO stage)
PLANS: list[tuple[str, str, GlobalBatch, StepPlan]] = [
    ("inter_unequal-ckpt2", "tiny_llama", TEXT, text_plans(2)["inter_unequal"]),
    ("multi_round-ckpt2", "tiny_llama", TEXT, text_plans(2)["multi_round"]),
    ("split_batch", "tiny_llama", TEXT, text_plans(0)["split_batch"]),
    ("dsp_mixed-ckpt2", "tiny_stdit", VIDEO, video_plans(2)["dsp_mixed"]),
]
STAGES = (0, 1, 2, 3)
# 2 KV heads on SP groups of 4: the exchange repeats each KV head to 4 (one per rank).
KV2 = dataclasses.replace(model_spec("tiny_llama"), name="tiny_llama_kv2", kv_heads=2)
CASES: list[tuple[str, Any, GlobalBatch, StepPlan, int]] = [
    *[(f"zero{z}-{label}", m, b, p, z) for z in STAGES for label, m, b, p in PLANS],
    *[(f"zero{z}-kv2-static_sp4", KV2, TEXT, text_plans(0)["static_sp4"], z) for z in (0, 3)],
]
# Mixed precision on CPU: bf16 compute, fp32 master weights, fp32 gradient accumulation and
# reduction (the CUDA policy), per stage; compared with the fp32 reference at bf16's tolerance.
BF16_STAGES = (0, 1, 3)
BF16_TOL = 3e-2
CURVE_STAGES = (1, 3)
CURVE_STEPS = 3
LR = 1e-3


def _curve_batches() -> list[GlobalBatch]:
    rng = np.random.default_rng(3)
    return [
        GlobalBatch(
            step=s,
            sample_ids=np.arange(10 * s, 10 * s + 6),
            tokens=rng.integers(8, 120, 6),
            frames=np.ones(6, dtype=np.int64),
        )
        for s in range(CURVE_STEPS)
    ]


def _curve_plan() -> StepPlan:
    return text_plans(1)["inter_unequal"]  # 7 samples in the hand plans; the curve batches use 6


def _worker(rank: int, port: int, out_dir: str) -> None:
    import torch.distributed as dist

    from dcp_bench.runtime.executor import execute_step
    from dcp_bench.runtime.groups import ProcessGroupPool
    from dcp_bench.runtime.training import build_training_state

    torch.set_num_threads(1)
    os.environ["MASTER_ADDR"] = "127.0.0.1"
    os.environ["MASTER_PORT"] = str(port)
    dist.init_process_group("gloo", rank=rank, world_size=WORLD)
    try:
        pool = ProcessGroupPool(timeout_s=120)
        out: dict[str, Any] = {"grads": [], "curves": {}, "bytes": {}}
        for _, model_name, batch, plan, stage in CASES:
            state = build_training_state(
                _spec(model_name), SEED, torch.device("cpu"), LR, zero_stage=stage
            )
            res = execute_step(plan, batch, state, None, pool, seed=SEED, update=False)
            out["grads"].append(
                {
                    "loss": res.loss,
                    "grads": state.gradients(),
                    "grad_norm": res.grad_norm,
                    "empty": res.extra.get("empty_passes", 0.0),
                }
            )
        out["bf16"] = {}
        for stage in BF16_STAGES:
            state = build_training_state(
                model_spec("tiny_llama"),
                SEED,
                torch.device("cpu"),
                LR,
                zero_stage=stage,
                compute=torch.bfloat16,
            )
            res = execute_step(
                text_plans(2)["inter_unequal"], TEXT, state, None, pool, seed=SEED, update=False
            )
            grads = state.gradients()
            # one update, then the bf16 parameters must be the rounding of the fp32 master weights
            execute_step(text_plans(2)["inter_unequal"], TEXT, state, None, pool, seed=SEED)
            rounded = None
            if stage <= 1:
                full = torch.empty(state.shard * state.world, dtype=torch.float32)  # type: ignore[attr-defined]
                if stage == 1:
                    dist.all_gather_into_tensor(full, state.master.detach())  # type: ignore[attr-defined]
                else:
                    full = state.master.detach()  # type: ignore[attr-defined]
                params = torch.cat([p.detach().reshape(-1) for p in state.model.parameters()])
                rounded = torch.equal(params, full[: params.numel()].to(torch.bfloat16))
            out["bf16"][stage] = {
                "loss": res.loss,
                "grads": grads,
                "describe": state.describe(),
                "rounded": rounded,
                "dtypes": sorted({str(p.dtype) for p in state.model.parameters()}),
            }
        plan = _curve_plan()
        for stage in CURVE_STAGES:
            state = build_training_state(
                model_spec("tiny_llama"), SEED, torch.device("cpu"), LR, zero_stage=stage
            )
            losses = []
            for batch in _curve_batches():
                losses.append(execute_step(_six(plan), batch, state, None, pool, seed=SEED).loss)
            out["curves"][stage] = losses
            out["bytes"][stage] = state.static_bytes()
        torch.save(out, Path(out_dir) / f"rank{rank}.pt")
    finally:
        dist.destroy_process_group()


def _spec(model: Any) -> ModelSpec:
    return model if isinstance(model, ModelSpec) else model_spec(model)


def _six(plan: StepPlan) -> StepPlan:
    """The hand plan without sample 6 (the curve batches hold 6 samples)."""
    from dcp_bench.plan import Group, MicroBatch, Round

    rounds = []
    for rnd in plan.rounds:
        groups = []
        for g in rnd.groups:
            mbs = [
                MicroBatch(
                    samples=tuple(s for s in mb.samples if s != 6),
                    ckpt_layers=mb.ckpt_layers,
                    split=mb.split,
                )
                for mb in g.micro_batches
            ]
            groups.append(
                Group(start=g.start, size=g.size, micro_batches=[mb for mb in mbs if mb.samples])
            )
        rounds.append(Round(groups=groups))
    return StepPlan(world_size=plan.world_size, rounds=rounds, mode=plan.mode)


@pytest.fixture(scope="module")
def sharded() -> list[dict[str, Any]]:
    with tempfile.TemporaryDirectory() as tmp:
        mp.spawn(_worker, args=(_free_port(), tmp), nprocs=WORLD, join=True)
        return [torch.load(Path(tmp) / f"rank{r}.pt") for r in range(WORLD)]


@pytest.mark.parametrize("index", range(len(CASES)), ids=[c[0] for c in CASES])
def test_sharded_gradients_equal_single_process(sharded: list[dict[str, Any]], index: int) -> None:
    _, model_name, batch, _, _ = CASES[index]
    if isinstance(model_name, ModelSpec):
        model = build_model(model_name, seed=SEED)
        ref_loss = reference_step(model, batch)
        ref_grads = torch.cat([p.grad.reshape(-1) for p in model.parameters()])  # type: ignore[union-attr]
    else:
        ref_loss, ref_grads = reference(model_name, batch, "text" if batch is TEXT else "video")
    for rank in range(WORLD):
        got = sharded[rank]["grads"][index]
        assert abs(got["loss"] - ref_loss) <= 1e-5 * abs(ref_loss)
        assert rel_l2(got["grads"], ref_grads) <= 1e-5
        # the norm that clipping uses: summed in fp64 (an fp32 norm of 3.4M elements is off by 5e-4)
        ref_norm = float(ref_grads.double().norm())
        assert abs(got["grad_norm"] - ref_norm) <= 1e-6 * ref_norm


def test_lockstep_stages_ran_empty_passes_where_ranks_had_fewer(
    sharded: list[dict[str, Any]],
) -> None:
    # Guards the scenarios: FSDP padded some rank of the unequal plan, the flat stages never pad.
    for index, (_, _, batch, plan, stage) in enumerate(CASES):
        counts = round_pass_counts(plan, batch)
        expected = [sum(max(c) - c[r] for c in counts) for r in range(WORLD)]
        got = [sharded[r]["grads"][index]["empty"] for r in range(WORLD)]
        assert got == (expected if stage >= 2 else [0.0] * WORLD)


def test_round_pass_counts_follow_the_plan() -> None:
    # inter_unequal: one round; rank 0-1 run one SP-2 micro-batch, rank 2 two, rank 3 two.
    assert round_pass_counts(text_plans(0)["inter_unequal"], TEXT) == [[1, 1, 2, 2]]
    # multi_round: every rank once in rounds 0 and 1, only rank 3 in round 2.
    assert round_pass_counts(text_plans(0)["multi_round"], TEXT) == [
        [1, 1, 1, 1],
        [1, 1, 1, 1],
        [0, 0, 0, 1],
    ]
    # two whole samples dealt to a group of 4: two ranks get one each, two get none.
    assert round_pass_counts(plan_of([[(0, 4, [mb(0, 1, split="batch")])]]), TEXT) == [[1, 1, 0, 0]]


@pytest.mark.parametrize("stage", BF16_STAGES)
def test_mixed_precision_keeps_fp32_master_and_reduction(
    sharded: list[dict[str, Any]], stage: int
) -> None:
    got = sharded[0]["bf16"][stage]
    assert got["describe"]["precision"] == {
        "compute": "bf16",
        "master": "fp32",
        "grad": "fp32",
        "optimizer_state": "fp32",
    }
    ref_loss, ref_grads = reference("tiny_llama", TEXT, "text")
    assert abs(got["loss"] - ref_loss) <= BF16_TOL * abs(ref_loss)
    assert rel_l2(got["grads"], ref_grads) <= BF16_TOL
    assert got["grads"].dtype == torch.float32
    if stage <= 1:  # flat states: bf16 parameters = bf16(fp32 master) after the update
        assert got["rounded"] is True and got["dtypes"] == ["torch.bfloat16"]
    else:  # FSDP: the stored shards are the fp32 master weights (gathered in bf16 per layer)
        assert got["dtypes"] == ["torch.float32"]
    # all ranks agree (the reduction is in fp32 and identical everywhere)
    for rank in range(1, WORLD):
        assert torch.equal(sharded[rank]["bf16"][stage]["grads"], got["grads"])


def test_sharded_adamw_steps_equal_single_process_training(sharded: list[dict[str, Any]]) -> None:
    model = build_model(model_spec("tiny_llama"), seed=SEED)
    opt = torch.optim.AdamW(model.parameters(), lr=LR, weight_decay=0.0)
    ref = []
    for batch in _curve_batches():
        opt.zero_grad(set_to_none=False)
        ref.append(reference_step(model, batch))
        # the executor clips at its default (None here), as the reference does not clip
        opt.step()
    for stage in CURVE_STAGES:
        got = sharded[0]["curves"][stage]
        assert max(abs(a - b) / abs(b) for a, b in zip(got, ref)) <= 1e-5, stage
        assert all(sharded[r]["curves"][stage] == got for r in range(WORLD))
    assert abs(ref[-1] - ref[0]) > 1e-3 * abs(ref[0])  # the steps changed the model


def test_state_bytes_equal_the_policy_the_cost_models_read(sharded: list[dict[str, Any]]) -> None:
    spec = model_spec("tiny_llama")
    pb = param_breakdown(spec)
    policy = precision_policy("fp32")
    for stage in CURVE_STAGES:
        predicted = static_state_bytes(pb.total, pb.per_layer, WORLD, stage, policy)
        predicted.pop("params_gathered", None)  # transient: a layer gathered while it runs
        held = sharded[0]["bytes"][stage]
        # Equal up to the padding of the flat shards (< WORLD elements per buffer) or FSDP's
        # uneven dim-0 chunks.
        assert abs(held - sum(predicted.values())) <= 0.01 * sum(predicted.values()), (
            stage,
            held,
            predicted,
        )
