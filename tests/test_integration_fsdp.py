"""FSDP2 with a library model: the transformers Llama of ``model=hf`` trained at ZeRO stages 2
and 3 (``fully_shard`` on each decoder layer, from the model's ``_no_split_modules``, and on the
root) equals the plain library model trained in one process.

The reference is independent of the runtime: the library's own model with its own attention, one
sample per forward, the loss from its logits, and ``torch.optim.AdamW`` for the updates. On 2 and
4 gloo ranks, hand-built plans with sequence parallelism, recompute and unequal groups (so FSDP's
lockstep empty passes run): the reduced gradient of one step (Llama at stages 2 and 3; Mistral and
Qwen2 at stage 3 on 2 ranks), and the Llama's parameters after 3 AdamW steps at stage 3. fp32.
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.multiprocessing as mp
import torch.nn.functional as F

pytest.importorskip("transformers", reason="transformers not installed: pip install -e '.[hf]'")

from integration_common import SEED, flat_grads, free_port, rel_l2  # noqa: E402
from test_integration_transformers import SPEC, build_plain, two_rank_plan  # noqa: E402
from test_runtime_dist import TEXT, text_plans  # noqa: E402

from dcp_bench.cost.specs import ModelSpec, model_spec  # noqa: E402
from dcp_bench.plan import StepPlan  # noqa: E402
from dcp_bench.runtime.integrations.transformers_lm import build_causal_lm  # noqa: E402
from dcp_bench.runtime.models import text_sample  # noqa: E402

pytestmark = pytest.mark.dist

LR = 1e-3
STEPS = 3
GRAD_TOL = 1e-5
# Relative error of the parameters' change over the steps: AdamW divides each gradient by its own
# running RMS, so where a gradient is near zero, summation-order noise of ~1e-7 becomes a visible
# part of that parameter's update (measured 1.2e-5 on 2 ranks).
PARAM_TOL = 1e-4


def _small(model_type: str) -> ModelSpec:
    return model_spec(
        f"small_{model_type}",
        library="transformers",
        config={
            "model_type": model_type,
            "hidden_size": 64,
            "num_hidden_layers": 2,
            "num_attention_heads": 4,
            "num_key_value_heads": 2,
            "intermediate_size": 128,
            "vocab_size": 256,
        },
    )


# (label, spec, plan, ZeRO stages) per world: the default model=hf Llama at both stages, and the
# other families the cost model prices (Mistral, Qwen2 with its q/k/v biases) at stage 3.
def _cases(world: int) -> list[tuple[str, ModelSpec, StepPlan, tuple[int, ...]]]:
    if world == 2:
        return [
            ("llama-two_rank", SPEC, two_rank_plan(), (2, 3)),
            ("mistral-two_rank", _small("mistral"), two_rank_plan(), (3,)),
            ("qwen2-two_rank", _small("qwen2"), two_rank_plan(), (3,)),
        ]
    return [
        ("llama-inter_unequal-ckpt2", SPEC, text_plans(2)["inter_unequal"], (2, 3)),
        ("llama-static_sp4", SPEC, text_plans(0)["static_sp4"], (2, 3)),
    ]


def _worker(rank: int, world: int, port: int, out_dir: str) -> None:
    import torch.distributed as dist

    from dcp_bench.runtime.executor import execute_step
    from dcp_bench.runtime.groups import ProcessGroupPool
    from dcp_bench.runtime.training import build_training_state

    torch.set_num_threads(1)
    os.environ["MASTER_ADDR"] = "127.0.0.1"
    os.environ["MASTER_PORT"] = str(port)
    dist.init_process_group("gloo", rank=rank, world_size=world)
    try:
        pool = ProcessGroupPool(timeout_s=120)
        out: dict[str, Any] = {}
        for label, spec, plan, stages in _cases(world):
            for stage in stages:
                state = build_training_state(spec, SEED, torch.device("cpu"), LR, zero_stage=stage)
                res = execute_step(plan, TEXT, state, None, pool, seed=SEED, update=False)
                out[f"grad-zero{stage}-{label}"] = {
                    "loss": res.loss,
                    "grads": state.gradients(),
                    "spec": spec.name,
                    "layers": spec.num_layers,
                    "empty": res.extra.get("empty_passes", 0.0),
                    "units": sum(
                        type(m).__name__.startswith("FSDP") for m in state.model.modules()
                    ),
                    "sharded": all(
                        hasattr(p, "to_local") and p.to_local().numel() < p.numel()
                        for p in state.model.parameters()
                        if p.shape[0] >= world
                    ),
                }
        plan = _cases(world)[0][2]
        state = build_training_state(SPEC, SEED, torch.device("cpu"), LR, zero_stage=3)
        for _ in range(STEPS):
            execute_step(plan, TEXT, state, None, pool, seed=SEED)
        out["params"] = torch.cat(
            [p.full_tensor().detach().reshape(-1) for p in state.model.parameters()]
        )
        torch.save(out, Path(out_dir) / f"rank{rank}.pt")
    finally:
        dist.destroy_process_group()


def _run(world: int) -> list[dict[str, Any]]:
    with tempfile.TemporaryDirectory() as tmp:
        mp.spawn(_worker, args=(world, free_port(), tmp), nprocs=world, join=True)
        return [torch.load(Path(tmp) / f"rank{r}.pt") for r in range(world)]


def _plain_training(spec: ModelSpec, steps: int) -> tuple[float, torch.Tensor, torch.Tensor]:
    """The plain library model of ``spec`` in one process (its own attention, one sample per
    forward, loss / batch tokens): the first step's loss and gradient, and the parameters' change
    after ``steps`` AdamW steps on the batch."""
    torch.manual_seed(SEED)
    model = build_causal_lm(spec)
    before = torch.cat([p.detach().reshape(-1).clone() for p in model.parameters()])
    opt = torch.optim.AdamW(model.parameters(), lr=LR, weight_decay=0.0)
    loss0, grads0 = 0.0, torch.empty(0)
    for step in range(max(1, steps)):  # the same batch every step, as the sharded runs
        opt.zero_grad(set_to_none=True)
        total = 0.0
        for sid, n in zip(TEXT.sample_ids.tolist(), TEXT.tokens.tolist()):
            seq = text_sample(SEED, sid, n, spec.vocab)
            logits = model(input_ids=seq[:n][None], use_cache=False).logits[0]
            loss = F.cross_entropy(logits.float(), seq[1:], reduction="sum") / TEXT.total_tokens
            loss.backward()
            total += float(loss.detach())
        if step == 0:
            loss0, grads0 = total, flat_grads(model.parameters()).clone()
        if steps:
            opt.step()
    after = torch.cat([p.detach().reshape(-1) for p in model.parameters()])
    return loss0, grads0, after - before


@pytest.mark.slow  # spawns of 2 (~25 s) and 4 ranks (~3 min) on 2 cores
@pytest.mark.parametrize("world", [2, 4])
def test_fsdp2_library_model_equals_single_process(world: int) -> None:
    results = _run(world)
    refs = {spec.name: _plain_training(spec, 0)[:2] for _, spec, _, _ in _cases(world)}
    for key, res in results[0].items():
        if not key.startswith("grad-"):
            continue
        ref_loss, ref_grads = refs[res["spec"]]
        assert res["units"] == res["layers"] + 1, key  # every decoder layer and the root
        assert res["sharded"], key
        assert abs(res["loss"] - ref_loss) <= 1e-5 * abs(ref_loss), key
        err = rel_l2(res["grads"], ref_grads)
        print(f"world {world} {key}: gradient rel. error {err:.1e}")
        assert err <= GRAD_TOL, (key, err)
        for other in results[1:]:
            assert torch.equal(other[key]["grads"], res["grads"]), key
    if world == 4:  # an unequal plan: ranks with fewer micro-batches ran empty passes
        assert any(r["grad-zero3-llama-inter_unequal-ckpt2"]["empty"] > 0 for r in results)
    _, _, ref_change = _plain_training(SPEC, STEPS)
    torch.manual_seed(SEED)
    before = torch.cat([p.detach().reshape(-1) for p in build_causal_lm(SPEC).parameters()])
    change = rel_l2(results[0]["params"] - before, ref_change)
    print(f"world {world}: parameter change after {STEPS} AdamW steps, rel. error {change:.1e}")
    assert change <= PARAM_TOL, change


def test_a_model_sharded_by_the_user_is_refused_by_the_integration_api() -> None:
    """DataCentricParallel all-reduces whole gradients: a model the user already sharded with
    fully_shard would have its gradients reduced twice, so it is refused by name."""
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    from dcp_bench.api import DataCentricParallel
    from dcp_bench.errors import ConfigError
    from dcp_bench.runtime.integrations.transformers_lm import CausalLMAdapter

    model = build_plain(SEED)
    adapter = CausalLMAdapter(model, spec=SPEC)
    dist.init_process_group(
        "gloo", init_method=f"tcp://127.0.0.1:{free_port()}", rank=0, world_size=1
    )
    try:
        fully_shard(model, mesh=init_device_mesh("cpu", (1,)))
        opt = torch.optim.AdamW(model.parameters(), lr=LR)
        with pytest.raises(ConfigError, match=r"LlamaForCausalLM is sharded with fully_shard"):
            DataCentricParallel(model, opt, [TEXT], method="dcp", adapter=adapter)
    finally:
        dist.destroy_process_group()


def test_fsdp_units_are_the_decoder_layers_or_a_refusal() -> None:
    from dcp_bench.errors import ConfigError
    from dcp_bench.runtime.integrations.transformers_lm import TransformersCausalLM

    with torch.device("meta"):
        model = TransformersCausalLM(SPEC)
    units = model.fsdp_units()
    assert [type(u).__name__ for u in units] == ["LlamaDecoderLayer"] * SPEC.num_layers
    assert units == list(model.lm.model.layers)
    model.lm._no_split_modules = []  # a model that names no blocks: refused, not sharded whole
    with pytest.raises(ConfigError, match=r"0 modules of its _no_split_modules \(none\) for 4"):
        model.fsdp_units()
