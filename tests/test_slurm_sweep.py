"""`dcp-bench sweep ... launcher=slurm` through submitit's local executor (subprocesses on this
machine stand in for Slurm jobs): the same records as a local sweep, resumable, bad settings
refused in one line."""

from __future__ import annotations

import shutil
import time
from pathlib import Path

import pytest

from dcp_bench.campaign.slurm import split_launcher
from dcp_bench.cli import main
from dcp_bench.errors import ConfigError
from dcp_bench.records import RecordError, read_steps, read_summary

GRID = [
    "method=dcp,packed_static",
    "workload=synthetic_uniform",
    "workload.low=100",
    "workload.high=4000",
    "workload.tokens_per_gpu=20000",
    "cluster=h200x8@24",
    "model=llama3_8b",
    "steps=2",
    "warmup_steps=1",
    "run.repeats=1",
]


def test_launcher_settings_are_split_from_the_grid() -> None:
    launcher, s, rest = split_launcher(
        [
            "launcher=slurm",
            "slurm.partition=gpu",
            "slurm.timeout_min=30",
            "slurm.wait=false",
            "method=dcp",
        ]
    )
    assert launcher == "slurm" and s.partition == "gpu" and s.timeout_min == 30 and not s.wait
    assert rest == ["method=dcp"]
    assert split_launcher(["method=dcp"])[0] == "local"
    with pytest.raises(ConfigError, match="launcher=pbs: expected one of local, slurm"):
        split_launcher(["launcher=pbs"])
    with pytest.raises(ConfigError, match="slurm.timeout_min=0: expected an integer >= 1"):
        split_launcher(["launcher=slurm", "slurm.timeout_min=0"])
    with pytest.raises(ConfigError, match="slurm.qos: unknown Slurm setting"):
        split_launcher(["launcher=slurm", "slurm.qos=high"])
    with pytest.raises(ConfigError, match="need launcher=slurm"):
        split_launcher(["slurm.partition=gpu"])


def _records(root: Path, campaign: str) -> dict[str, tuple[str, list[float | None], float | None]]:
    out = {}
    for run in sorted(
        p for p in (root / campaign).iterdir() if p.is_dir() and not p.name.startswith(".")
    ):
        summary = read_summary(run)
        assert summary is not None
        out[run.name] = (
            summary.status,
            [s.step_time_s for s in read_steps(run)],
            summary.lower_bound_s,
        )
    return out


@pytest.mark.slow  # a subprocess per run (imports dcp_bench, then simulates): ~10 s each here
def test_slurm_sweep_writes_the_local_records_and_resumes(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["sweep", *GRID, f"root={tmp_path / 'local'}", "campaign=c", "--no-progress"]) == 0
    slurm = ["launcher=slurm", "slurm.executor=local", "slurm.timeout_min=10"]
    assert main(["sweep", *GRID, *slurm, f"root={tmp_path / 'slurm'}", "campaign=c"]) == 0
    assert "submitted 2 run(s) as local job(s)" in capsys.readouterr().out
    local, remote = _records(tmp_path / "local", "c"), _records(tmp_path / "slurm", "c")
    assert (
        local == remote and len(local) == 2
    )  # same run ids, statuses, simulated step times, bounds
    assert all(status == "ok" for status, _, _ in remote.values())
    # Resumable: nothing to submit when every run is complete; a lost run is submitted alone.
    assert main(["sweep", *GRID, *slurm, f"root={tmp_path / 'slurm'}", "campaign=c"]) == 0
    out = capsys.readouterr().out
    assert "submitted" not in out and "0 run(s) done, 2 already complete" in out
    lost = sorted(remote)[0]
    shutil.rmtree(tmp_path / "slurm" / "c" / lost)
    assert main(["sweep", *GRID, *slurm, f"root={tmp_path / 'slurm'}", "campaign=c"]) == 0
    out = capsys.readouterr().out
    assert "submitted 1 run(s)" in out and "1 run(s) done, 1 already complete" in out
    assert _records(tmp_path / "slurm", "c") == local
    # Without waiting: submitted and returned; once the job has written the run, the same
    # command finds every run complete.
    shutil.rmtree(tmp_path / "slurm" / "c" / lost)
    assert (
        main(
            ["sweep", *GRID, *slurm, "slurm.wait=false", f"root={tmp_path / 'slurm'}", "campaign=c"]
        )
        == 0
    )
    assert "1 run(s) submitted, 1 already complete; rerun this command" in capsys.readouterr().out
    deadline = time.time() + 240
    while read_summary_or_none(tmp_path / "slurm" / "c" / lost) is None and time.time() < deadline:
        time.sleep(0.5)
    assert main(["sweep", *GRID, *slurm, f"root={tmp_path / 'slurm'}", "campaign=c"]) == 0
    assert "0 run(s) done, 2 already complete" in capsys.readouterr().out
    assert _records(tmp_path / "slurm", "c") == local


def read_summary_or_none(run: Path) -> object:
    try:
        return read_summary(run)
    except RecordError:
        return None
