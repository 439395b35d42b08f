"""End-to-end checks of `dcp-bench train` under torchrun (gloo, 2 ranks): a crashed rank ends the
run with an error instead of a hang, two runs with the same seed give bitwise-identical losses, a
non-finite loss stops the run with status ``nonfinite``, and rank 0 writes complete run records."""

from __future__ import annotations

import dataclasses
import sys
import time
import uuid
from pathlib import Path
from typing import Any

import pytest

from dcp_bench.cli import main
from dcp_bench.records import read_steps, read_summary
from dcp_bench.run.spec import parse_run_spec
from dcp_bench.run.torch_run import (
    RANK_ERROR_MARK,
    STDERR_KEEP_LINES,
    STDERR_LOG,
    _keep_stderr,
    _retryable,
    error_tail,
    launch_torch_run,
)
from dcp_bench.run.train_config import resolve_train_config

sys.path.insert(0, str(Path(__file__).resolve().parent))
from processes import HAS_PROC, TAG, kill_tagged, tagged  # noqa: E402

pytestmark = pytest.mark.dist

SMALL = [
    "workload=synthetic_uniform",
    "workload.low=16",
    "workload.high=200",
    "workload.tokens_per_gpu=400",
    "method=bucket_static",
    "model=tiny_llama",
]


def _run(tmp_path: Path, campaign: str, *overrides: str) -> dict[str, Any]:
    cfg = resolve_train_config(
        [
            *SMALL,
            "nproc=2",
            "steps=2",
            "warmup_steps=1",
            "seed=5",
            f"root={tmp_path}",
            f"campaign={campaign}",
            "train.pg_timeout_s=60",
            "timeout_s=240",
            *overrides,
        ]
    )
    return dataclasses.asdict(launch_torch_run(parse_run_spec(cfg)))


@pytest.mark.slow  # two torchrun launches (~50 s here)
def test_same_seed_gives_bitwise_identical_losses_and_records(tmp_path: Path) -> None:
    a = _run(tmp_path, "a")
    b = _run(tmp_path, "b")
    assert a["status"] == b["status"] == "ok"
    assert len(a["training"]["losses"]) == 3
    assert a["training"]["losses"] == b["training"]["losses"]
    assert a["training"]["grad_norms"] == b["training"]["grad_norms"]
    # Records: written by rank 0, complete, one line per step, losses as in the summary.
    steps = read_steps(tmp_path / "a" / a["run_id"])
    assert [s.loss for s in steps] == list(a["training"]["losses"])
    assert [s.warmup for s in steps] == [True, False, False]
    assert all(len(s.busy_s or []) == 2 and s.step_time_s and s.step_time_s > 0 for s in steps)
    summary = read_summary(tmp_path / "a" / a["run_id"])
    assert summary is not None and summary.executor == "torch" and summary.n_steps == 2
    # The cost model's prediction of the same plans sits beside every measured step.
    assert all(
        s.extra["predicted_step_time_s"] > 0 and s.extra["predicted_peak_mem_gib"] > 0
        for s in steps
    )
    assert summary.predictions is not None and (summary.predictions.step_time_s or 0) > 0


def test_crashed_rank_makes_the_run_fail_not_hang(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Fault injection (docs/runtime.md): rank 1 raises at step 1; the run is recorded as an error
    with the injected message, and no process of it is left."""
    tag = uuid.uuid4().hex
    monkeypatch.setenv(TAG, tag)
    t0 = time.monotonic()
    try:
        out = _run(
            tmp_path, "crash", "train.fail_rank=1", "train.fail_step=1", "train.pg_timeout_s=30"
        )
        assert not HAS_PROC or tagged(tag) == []
    finally:
        kill_tagged(tag)
    assert out["status"] == "error" and "injected failure on rank 1 at step 1" in out["error"]
    # The surviving rank is stopped by torchrun or by the 30 s group timeout, well before the
    # 240 s launcher limit that would signal a hang.
    assert time.monotonic() - t0 < 200
    summary = read_summary(tmp_path / "crash" / out["run_id"])
    assert summary is not None and summary.status == "error"  # recorded, never "ok"


@pytest.mark.slow
def test_nonfinite_loss_stops_with_status(tmp_path: Path) -> None:
    # An absurd learning rate overflows the parameters after the first step.
    out = _run(tmp_path, "nonfinite", "lr=1e30", "train.grad_clip=null", "steps=3")
    assert out["status"] == "nonfinite"
    losses = out["training"]["losses"]
    assert len(losses) < 4 and any(
        x is None for x in losses
    )  # the non-finite loss is recorded as null


def test_train_keys_mean_what_they_mean_everywhere() -> None:
    spec = parse_run_spec(
        resolve_train_config(
            ["workload=wikipedia", "method=dcp", "nproc=2", "steps=7", "lr=0.01", "seed=3"]
        )
    )
    assert (
        spec.steps == 7 and spec.warmup_steps == 2 and spec.total_steps == 9
    )  # steps = measured steps
    assert spec.world_size == 2 and spec.cluster.name == "cpu@2" and spec.train.lr == 0.01
    assert spec.seed == 3 and spec.executor == "torch" and spec.model.name == "tiny_llama"


@pytest.mark.slow  # one torchrun launch
def test_train_command_reports_the_measured_steps(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["train", *SMALL, "nproc=2", "steps=2", f"root={tmp_path}"]) == 0
    out = capsys.readouterr().out
    assert "status ok, 2 measured steps, median step" in out and "median step None" not in out


def test_only_failures_no_rank_raised_are_retried_and_errors_say_more_than_torchrun() -> None:
    port_taken = (
        "torch.distributed.DistNetworkError: The server socket has failed to listen on any local "
        "network address. port: 29500, useIPv6: false, code: -98, name: EADDRINUSE\n"
        "torch.distributed.elastic.multiprocessing.errors.ChildFailedError:\n"
    )
    assert _retryable(port_taken)
    assert "EADDRINUSE" in error_tail(port_taken)
    rank_failed = f"{RANK_ERROR_MARK} RuntimeError: boom\nConnection reset by peer\n"
    assert not _retryable(rank_failed)  # a rank that raised is not retried
    assert error_tail(rank_failed) == "RuntimeError: boom"
    assert _retryable("traceback : Signal 9 (SIGKILL) received by PID 123\n")  # died below Python
    # torchrun's own closing lines are not the cause
    killed = (
        "RuntimeError: [../third_party/gloo/gloo/transport/tcp/pair.cc:534] Connection closed by "
        "peer\nTraceback (most recent call last):\n    raise "
        "ChildFailedError(\ntorch.distributed.elastic.multiprocessing.errors.ChildFailedError:\n"
    )
    assert error_tail(killed).startswith("RuntimeError: [../third_party/gloo")


def test_a_refusal_on_every_rank_is_rank_0s_message_on_one_line(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    from dcp_bench.errors import ConfigError
    from dcp_bench.run.torch_run import write_rank_error

    def fail(rank: str, exc: Exception) -> None:
        monkeypatch.setenv("RANK", rank)
        try:
            raise exc
        except Exception as raised:
            write_rank_error(raised)

    for rank in ("1", "0"):  # rank 1 reports first; the same refusal is shown as rank 0's
        fail(rank, ConfigError("refused:\n  attention argument s_aux"))
    stderr = capsys.readouterr().err
    assert stderr.count("Traceback (most recent call last)") == 2  # the traces stay in the log
    assert error_tail(stderr) == "rank 0: ConfigError: refused: attention argument s_aux"
    # a rank 0 that failed only because rank 1 did: the first failure is the cause
    fail("1", RuntimeError("injected"))
    fail("0", RuntimeError("Connection closed by peer"))
    assert error_tail(capsys.readouterr().err) == "rank 1: RuntimeError: injected"


@pytest.mark.slow  # one torchrun launch
@pytest.mark.timeout(600)
def test_a_refusal_under_torchrun_is_one_line_with_the_trace_in_the_runs_log(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    pytest.importorskip("transformers")
    overrides = ["model=hf", "+model.config.attention_dropout=0.1", "nproc=2", "steps=1"]
    assert main(["train", *SMALL[:-1], *overrides, f"root={tmp_path}"]) == 3
    out = capsys.readouterr().out
    errors = [ln for ln in out.splitlines() if "ConfigError" in ln]
    assert len(errors) == 1 and "rank 0: ConfigError" in errors[0], out
    assert "attention argument dropout=0.1" in errors[0]
    logs = list(tmp_path.rglob(STDERR_LOG))
    assert len(logs) == 1 and "Traceback (most recent call last)" in logs[0].read_text()


def test_a_failed_run_keeps_the_ranks_output(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    _keep_stderr(run_dir, "\n".join(f"line {i}" for i in range(1000)))
    kept = (run_dir / STDERR_LOG).read_text().splitlines()
    assert len(kept) == STDERR_KEEP_LINES and kept[-1] == "line 999"
    _keep_stderr(
        tmp_path / "gone", "x"
    )  # a folder that no longer exists: nothing written, no error
    assert not (tmp_path / "gone").exists()


@pytest.mark.slow  # two launches of torchrun
def test_a_rank_that_died_without_an_exception_is_retried_once_and_recorded(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The first attempt dies the way a signal-killed rank does (torchrun exit 1, no rank's marked
    exception): the run is started once more, fresh, and its record says so."""
    from dcp_bench.run import torch_run

    real = torch_run.run_session
    calls: list[int] = []

    def first_dies(cmd: list[str], env: dict[str, str], limit_s: float | None) -> Any:
        calls.append(1)
        if len(calls) == 1:
            return (
                1,
                "traceback : Signal 9 (SIGKILL) received by PID 1\n    raise ChildFailedError(\n",
                [],
            )
        return real(cmd, env, limit_s)

    monkeypatch.setattr(torch_run, "run_session", first_dies)
    out = _run(tmp_path, "retry")
    assert len(calls) == 2 and out["status"] == "ok" and out["n_steps"] == 2
    assert out["executor_info"]["previous_attempt"].startswith(
        "attempt 1 failed (torchrun exit 1): traceback : Signal 9"
    )
    run_dir = tmp_path / "retry" / out["run_id"]
    assert (
        "Signal 9" in (run_dir / "stderr.attempt1.log").read_text()
        and not (run_dir / STDERR_LOG).exists()
    )


@pytest.mark.slow  # a torchrun launch that ends in a teardown abort
def test_a_rank_that_aborts_in_the_teardown_leaves_the_finished_record(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Rank 0 finished and recorded the run; then a rank aborts in the teardown (torchrun exit 1,
    SIGABRT, no rank's exception): the record stands as written, with the ranks' output beside
    it."""
    from dcp_bench.run import torch_run

    real = torch_run.run_session

    def aborts_after(cmd: list[str], env: dict[str, str], limit_s: float | None) -> Any:
        code, _, survivors = real(cmd, env, limit_s)
        assert code == 0
        return (
            1,
            "terminate called without an active exception\ntraceback : Signal 6 (SIGABRT)\n",
            survivors,
        )

    monkeypatch.setattr(torch_run, "run_session", aborts_after)
    out = _run(tmp_path, "teardown")
    run_dir = tmp_path / "teardown" / out["run_id"]
    summary = read_summary(run_dir)
    assert (
        out["status"] == "ok"
        and summary is not None
        and summary.status == "ok"
        and summary.n_steps == 2
    )
    assert "SIGABRT" in (run_dir / STDERR_LOG).read_text()
