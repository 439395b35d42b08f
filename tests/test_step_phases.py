"""The step's phase clock (`dcp_bench.runtime.step_meter.PhaseClock`): what a measured step spent
building inputs, in forward, in backward and in the end-of-step work, the quantities the cost
model's terms price one by one.

- spans add their wall time to their phase and refuse an unknown phase;
- a real one-rank step reports every phase, forward and backward inside the busy time, and the
  phases together inside the step's wall time.
"""

from __future__ import annotations

import os
import tempfile
import time

import numpy as np
import pytest
import torch
import torch.distributed as dist

from dcp_bench.batch import GlobalBatch
from dcp_bench.cost.specs import model_spec
from dcp_bench.plan import Group, MicroBatch, Round, StepPlan
from dcp_bench.runtime.groups import ProcessGroupPool
from dcp_bench.runtime.step_meter import PhaseClock, load_average_1m
from dcp_bench.runtime.training import build_training_state


def test_spans_add_up_per_phase() -> None:
    clock = PhaseClock(torch.device("cpu"))
    with clock.span("forward"):
        time.sleep(0.02)
    with clock.span("forward"):
        time.sleep(0.01)
    with clock.span("finish"):
        time.sleep(0.01)
    got = clock.seconds()
    assert set(got) == set(PhaseClock.PHASES)
    assert got["forward"] >= 0.03 and got["finish"] >= 0.01
    assert got["inputs"] == 0.0 and got["backward"] == 0.0


def test_an_unknown_phase_is_refused() -> None:
    clock = PhaseClock(torch.device("cpu"))
    with (
        pytest.raises(ValueError, match="phase 'optimizer'; expected one of inputs"),
        clock.span("optimizer"),
    ):
        pass


def test_the_load_average_is_the_machine_s() -> None:
    load = load_average_1m()
    assert load is not None and load >= 0.0
    assert abs(load - os.getloadavg()[0]) < 5.0  # read a moment apart


def test_a_real_step_reports_its_phases() -> None:
    from dcp_bench.runtime.executor import execute_step

    batch = GlobalBatch(
        step=0,
        sample_ids=np.array([3, 4, 5], dtype=np.int64),
        tokens=np.array([40, 24, 64], dtype=np.int64),
        frames=np.ones(3, dtype=np.int64),
    )
    plan = StepPlan(
        world_size=1,
        rounds=[
            Round(
                groups=[
                    Group(
                        start=0,
                        size=1,
                        micro_batches=[
                            MicroBatch(samples=(0, 1), ckpt_layers=0),
                            MicroBatch(samples=(2,), ckpt_layers=2),
                        ],
                    )
                ]
            )
        ],
    )
    torch.set_num_threads(1)
    with tempfile.TemporaryDirectory(prefix="dcp-phases-") as tmp:
        dist.init_process_group("gloo", init_method=f"file://{tmp}/pg", rank=0, world_size=1)
        try:
            state = build_training_state(model_spec("tiny_llama"), 0, torch.device("cpu"), 1e-3)
            t0 = time.perf_counter()
            res = execute_step(plan, batch, state, None, ProcessGroupPool(timeout_s=60))
            wall = time.perf_counter() - t0
        finally:
            dist.destroy_process_group()
    ph = res.phase_s
    assert set(ph) == set(PhaseClock.PHASES)
    assert all(ph[k] > 0 for k in PhaseClock.PHASES)
    # forward and backward are the busy span's two parts; input building and the end-of-step
    # work lie outside it, and every phase lies inside the step
    assert ph["forward"] + ph["backward"] <= res.busy_s + 1e-6
    assert ph["forward"] + ph["backward"] >= 0.9 * res.busy_s
    assert sum(ph.values()) <= wall
