"""End-to-end checks of `dcp-bench train` under torchrun (gloo, 2 ranks): a crashed rank ends the
run with an error instead of a hang, two runs with the same seed give bitwise-identical losses, a
non-finite loss stops the run with status ``nonfinite``, and rank 0 writes complete run records."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pytest

from dcp_bench.commands.train import resolve_train_config, split_overrides
from dcp_bench.records import read_steps, read_summary
from dcp_bench.runtime.launch import TrainError, TrainSettings, launch_train

pytestmark = pytest.mark.dist

SMALL = [
    "workload=synthetic_uniform",
    "workload.low=16",
    "workload.high=200",
    "workload.tokens_per_gpu=400",
    "method=bucket_static",
    "model=tiny_llama",
]


def _run(tmp_path: Path, run_id: str, **settings: Any) -> dict[str, Any]:
    cfg = resolve_train_config(SMALL)
    base: dict[str, Any] = dict(nproc=2, steps=3, warmup_steps=1, seed=5, root=str(tmp_path), campaign="t",
                                run_id=run_id, timeout_s=60, run_timeout_s=240)
    base.update(settings)
    return launch_train(cfg, TrainSettings(**base))


@pytest.mark.slow  # two torchrun launches (~50 s here)
def test_same_seed_gives_bitwise_identical_losses_and_records(tmp_path: Path) -> None:
    a = _run(tmp_path, "a")
    b = _run(tmp_path, "b")
    assert a["status"] == b["status"] == "ok"
    assert len(a["extra"]["losses"]) == 3
    assert a["extra"]["losses"] == b["extra"]["losses"]
    assert a["extra"]["grad_norms"] == b["extra"]["grad_norms"]
    # Records: written by rank 0, complete, one line per step, losses as in the summary.
    steps = read_steps(tmp_path / "t" / "a")
    assert [s.loss for s in steps] == a["extra"]["losses"]
    assert [s.warmup for s in steps] == [True, False, False]
    assert all(len(s.busy_s or []) == 2 and s.step_time_s and s.step_time_s > 0 for s in steps)
    summary = read_summary(tmp_path / "t" / "a")
    assert summary is not None and summary.executor == "torch" and summary.n_steps == 2


def test_crashed_rank_makes_the_run_fail_not_hang(tmp_path: Path) -> None:
    t0 = time.monotonic()
    with pytest.raises(TrainError, match="injected failure"):
        _run(tmp_path, "crash", fail_rank=1, fail_step=1, timeout_s=30)
    # The surviving rank is stopped by torchrun or by the 30 s group timeout, well before the
    # 240 s launcher limit that would signal a hang.
    assert time.monotonic() - t0 < 200
    assert read_summary(tmp_path / "t" / "crash") is None  # an incomplete run, never "ok"


@pytest.mark.slow
def test_nonfinite_loss_stops_with_status(tmp_path: Path) -> None:
    # An absurd learning rate overflows the parameters after the first step.
    out = _run(tmp_path, "nan", lr=1e30, grad_clip=None, steps=4)
    assert out["status"] == "nonfinite"
    losses = out["extra"]["losses"]
    assert len(losses) < 4 and not all(abs(x) < float("inf") for x in losses)


def test_train_overrides_split_settings_from_config() -> None:
    cfg_ovs, settings = split_overrides(["workload=wikipedia", "nproc=4", "steps=7", "lr=0.01", "seed=3"])
    assert settings == {"nproc": 4, "lr": 0.01}
    assert cfg_ovs == ["workload=wikipedia", "run.steps=7", "seed=3"]


def test_only_launch_failures_are_retried_and_errors_say_more_than_torchrun() -> None:
    from dcp_bench.runtime.launch import RANK_ERROR_MARK, _error_tail, _is_launch_failure

    port_taken = (
        "torch.distributed.DistNetworkError: The server socket has failed to listen on any local "
        "network address. port: 29500, useIPv6: false, code: -98, name: EADDRINUSE\n"
        "torch.distributed.elastic.multiprocessing.errors.ChildFailedError:\n"
    )
    assert _is_launch_failure(port_taken)
    assert "EADDRINUSE" in _error_tail(port_taken)
    rank_failed = f"{RANK_ERROR_MARK} RuntimeError: boom\nConnection reset by peer\n"
    assert not _is_launch_failure(rank_failed)  # a rank that trained and failed is not retried
    assert _error_tail(rank_failed) == "RuntimeError: boom"
    assert not _is_launch_failure("ValueError: bad config\n")
