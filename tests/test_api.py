"""The integration API: bad use gets an error saying what to change, and the DCP example trains
exactly like the plain single-process loop (same losses on the same data)."""

from __future__ import annotations

import importlib.util
import json
import os
import socket
import sys
import tempfile
from pathlib import Path
from types import ModuleType
from typing import Any

import numpy as np
import pytest
import torch
import torch.multiprocessing as mp
from torch import nn

from dcp_bench.api import _batches, check_model
from dcp_bench.batch import GlobalBatch
from dcp_bench.errors import ConfigError, WorkloadError
from dcp_bench.paths import REPO_ROOT

EXAMPLES = REPO_ROOT / "examples"


def load_example(name: str) -> ModuleType:
    spec = importlib.util.spec_from_file_location(f"example_{name}", EXAMPLES / f"{name}.py")
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_model_without_sp_attention_is_refused_with_a_fix() -> None:
    with pytest.raises(ConfigError) as err:
        check_model(nn.Linear(4, 4))
    msg = str(err.value)
    assert "Linear" in msg and "RuntimeModel" in msg and "ulysses_seq_to_heads" in msg


def test_model_whose_loss_takes_no_sp_group_is_refused() -> None:
    class NoSP(nn.Module):
        spec = None

        def make_inputs(self, sample_ids: Any, tokens: Any) -> None:
            del sample_ids, tokens

        def loss_sum(self, inputs: Any) -> None:
            del inputs

    with pytest.raises(ConfigError, match="take no `sp`"):
        check_model(NoSP())


def test_runtime_models_are_accepted() -> None:
    from dcp_bench.cost.specs import model_spec
    from dcp_bench.runtime.models import build_model

    for name in ("tiny_llama", "tiny_stdit"):
        check_model(build_model(model_spec(name)))  # raises on failure


def test_loader_without_lengths_is_refused_with_a_fix() -> None:
    loader = [torch.zeros(3, 5), torch.zeros(3, 5)]  # padded tensors: no per-sample lengths
    with pytest.raises(WorkloadError) as err:
        next(_batches(loader, world_size=2))
    assert "lengths" in str(err.value) and "GlobalBatch" in str(err.value)
    with pytest.raises(WorkloadError):
        next(_batches(42, world_size=2))


def test_batches_accept_length_dicts_and_global_batches() -> None:
    gb = GlobalBatch.from_lengths([5, 7])
    items = [gb, {"lengths": [3, 4, 9], "sample_ids": [10, 11, 12]}]
    out = list(_batches(items, world_size=2))
    assert out[0] is gb
    assert out[1].tokens.tolist() == [3, 4, 9] and out[1].sample_ids.tolist() == [10, 11, 12]
    assert out[1].frames.tolist() == [1, 1, 1] and out[1].step == 1


def test_a_workload_supplies_one_batch_per_step_for_the_world() -> None:
    class FixedWorkload:  # the Workload interface: global_batch(step, world_size)
        def global_batch(self, step: int, world_size: int) -> GlobalBatch:
            return GlobalBatch.from_lengths([10 * world_size] * (step + 1), step=step)

    it = _batches(FixedWorkload(), world_size=4)
    first, second = next(it), next(it)
    assert (first.step, first.n, second.step, second.n) == (0, 1, 1, 2)
    assert first.tokens.tolist() == [40]


def test_building_without_torch_distributed_says_what_to_call() -> None:
    import torch.distributed as dist

    from dcp_bench.api import DataCentricParallel
    from dcp_bench.cost.specs import model_spec
    from dcp_bench.runtime.models import build_model

    assert not dist.is_initialized()
    model = build_model(model_spec("tiny_llama"))
    with pytest.raises(ConfigError, match="init_process_group"):
        DataCentricParallel(model, None, [GlobalBatch.from_lengths([5])])


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _run_dcp_example(rank: int, world: int, port: int, steps: int, out: str) -> None:
    os.environ.update(
        {
            "RANK": str(rank),
            "WORLD_SIZE": str(world),
            "MASTER_ADDR": "127.0.0.1",
            "MASTER_PORT": str(port),
        }
    )
    torch.set_num_threads(1)
    sys.path.insert(0, str(REPO_ROOT))
    import torch.distributed as dist

    mod = load_example("train_dcp")
    try:
        losses = mod.train(steps)
        if rank == 0:
            Path(out).write_text(json.dumps(losses))
    finally:
        dist.destroy_process_group()


@pytest.mark.dist
def test_dcp_example_on_two_ranks_matches_the_plain_loop() -> None:
    steps = 3
    torch.set_num_threads(1)
    plain = load_example("train_plain").train(steps)
    with tempfile.TemporaryDirectory() as tmp:
        out = os.path.join(tmp, "losses.json")
        mp.spawn(_run_dcp_example, args=(2, _free_port(), steps, out), nprocs=2, join=True)
        dcp = json.loads(Path(out).read_text())
    assert len(dcp) == len(plain) == steps
    # the same gradient every step (global-token normalisation) -> the same trajectory, up to
    # the order of floating-point sums across ranks
    np.testing.assert_allclose(dcp, plain, rtol=2e-5, atol=0)
    assert plain[-1] < plain[0]  # the loop does train
