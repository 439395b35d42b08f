"""Pieces of the GPU check that run in-process on CPU: a training state is freed when dropped
(its gradient hooks do not keep it alive), the element-wise attention check passes the runtime's
kernels and fails broken ones, the smoke test fails on a broken kernel, and the provenance."""

from __future__ import annotations

import gc
import weakref

import numpy as np
import torch

from dcp_bench.cost.specs import model_spec
from dcp_bench.runtime.attention import SINGLE
from dcp_bench.runtime.training import FlatState, build_training_state


def _train_once(state: FlatState) -> None:
    model = state.model
    inputs = model.make_inputs(np.array([0, 1]), np.array([48, 16]), np.array([1, 1]), SINGLE, 0)
    (model.loss_sum(inputs, SINGLE, 0) / 64).backward()


def test_a_dropped_training_state_is_freed_with_its_buffers() -> None:
    refs = []
    for seed in (0, 1):
        state = build_training_state(model_spec("tiny_llama"), seed, torch.device("cpu"), lr=1e-3, zero_stage=0)
        assert isinstance(state, FlatState)
        state.begin_step()
        _train_once(state)
        # the hook moved every gradient into the fp32 accumulator and freed the parameter's own
        assert float(state.main_grad.abs().sum()) > 0
        assert all(p.grad is None for p in state.params)
        refs.append((weakref.ref(state), weakref.ref(state.main_grad), weakref.ref(state.model)))
        del state
    gc.collect()
    alive = [i for i, r in enumerate(refs) if any(x() is not None for x in r)]
    assert alive == [], f"training states {alive} still alive after gc.collect()"
