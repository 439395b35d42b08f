"""`dcp-bench slurm`: the sbatch script is valid bash, sizes the job from the cluster, names the
torchrun rendezvous (first node of the allocation) and runs `dcp-bench train` on every node with
the multi-node keys; bad input is a one-line error."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

from dcp_bench.cli import main

RUN = ["workload=prolong", "method=dcp", "model=llama3_8b", "steps=5", "root=/shared/runs"]


def _script(tmp_path: Path, *extra: str) -> str:
    out = tmp_path / "job.sbatch"
    assert (
        main(
            [
                "slurm",
                *RUN,
                *extra,
                "--out",
                str(out),
                "--partition",
                "gpu",
                "--setup",
                "module load cuda",
            ]
        )
        == 0
    )
    return out.read_text()


@pytest.mark.skipif(shutil.which("bash") is None, reason="needs bash")
def test_script_is_valid_bash_and_names_the_rendezvous(tmp_path: Path) -> None:
    text = _script(tmp_path, "cluster=h200x32")
    subprocess.run(["bash", "-n", str(tmp_path / "job.sbatch")], check=True)
    lines = text.splitlines()
    assert lines[0] == "#!/bin/bash"
    # 32 x H200 = 4 nodes of 8: the cluster sizes the allocation, one task per node
    for expected in (
        "#SBATCH --nodes=4",
        "#SBATCH --gpus-per-node=8",
        "#SBATCH --ntasks-per-node=1",
        "#SBATCH --partition=gpu",
        "module load cuda",
        "RDZV_PORT=29500",
        'RDZV_HOST=$(scontrol show hostnames "$SLURM_JOB_NODELIST" | head -n 1)',
    ):
        assert expected in lines, expected
    # every #SBATCH line precedes the first command (sbatch stops reading them there)
    first_cmd = next(i for i, ln in enumerate(lines) if ln and not ln.startswith("#"))
    assert all(i < first_cmd for i, ln in enumerate(lines) if ln.startswith("#SBATCH"))
    joined = " ".join(text.replace("\\\n", " ").split())
    assert "srun --nodes=4 --ntasks-per-node=1" in joined
    for arg in (
        "-m dcp_bench.cli train",
        "workload=prolong",
        "cluster=h200x32",
        "nnodes=4",
        '"rdzv_endpoint=${RDZV_HOST}:${RDZV_PORT}"',
        '"train.rdzv_id=${SLURM_JOB_ID}"',
    ):
        assert arg in joined, arg


def test_script_runs_the_train_command_it_was_checked_with(tmp_path: Path) -> None:
    # The node command, with the rendezvous filled in, is a run spec of 4 nodes x 8 ranks whose
    # torchrun arguments name the c10d rendezvous.
    from dcp_bench.run.spec import parse_run_spec
    from dcp_bench.run.train_config import resolve_train_config

    text = _script(tmp_path, "cluster=h200x32", "--port", "29611")
    cmd = " ".join(text.replace("\\\n", " ").split()).split("dcp_bench.cli train", 1)[1].split()
    overrides = [
        a.strip('"')
        .replace("${RDZV_HOST}", "node001")
        .replace("${RDZV_PORT}", "29611")
        .replace("${SLURM_JOB_ID}", "123")
        for a in cmd
    ]
    spec = parse_run_spec(resolve_train_config(overrides))
    assert spec.world_size == 32 and spec.train.nnodes == 4
    assert spec.train.torchrun_args == (
        "--nnodes",
        "4",
        "--rdzv-backend",
        "c10d",
        "--rdzv-endpoint",
        "node001:29611",
        "--rdzv-id",
        "123",
    )


def test_resized_cluster_sizes_the_job(tmp_path: Path) -> None:
    text = _script(tmp_path, "cluster=h200x32", "nproc=16")
    assert "#SBATCH --nodes=2" in text and "nnodes=2" in text.replace("\\\n", " ")


@pytest.mark.parametrize(
    "args, message",
    [
        ([], "cluster=NAME"),
        (["cluster=h200x32", "nnodes=2"], "sets nnodes"),
        (["cluster=h200x32", "--port", "80"], "--port 80"),
        (["cluster=nope"], "unknown cluster"),
    ],
)
def test_bad_input_is_one_line_error(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], args: list[str], message: str
) -> None:
    assert main(["slurm", *RUN, *args, "--out", str(tmp_path / "x.sbatch")]) == 2
    err = capsys.readouterr().err.strip()
    assert message in err and len(err.splitlines()) == 1
    assert not (tmp_path / "x.sbatch").exists()


def test_core_writes_the_script_the_command_writes(tmp_path: Path) -> None:
    # `dcp-bench slurm` is argument parsing around `write_sbatch_script`: the same options give the
    # same bytes, and a bad option is refused before anything is written.
    from dcp_bench.campaign.sbatch import SbatchOptions, write_sbatch_script
    from dcp_bench.errors import ConfigError
    from dcp_bench.paths import REPO_ROOT

    text = _script(tmp_path, "cluster=h200x32")
    options = SbatchOptions(partition="gpu", setup=("module load cuda",))
    out, spec = write_sbatch_script(
        [*RUN, "cluster=h200x32"], options, Path(REPO_ROOT), out=str(tmp_path / "core.sbatch")
    )
    assert out.read_text() == text and spec.world_size == 32 and spec.train.nnodes == 4
    with pytest.raises(ConfigError, match="--time '2 hours'"):
        write_sbatch_script(
            [*RUN, "cluster=h200x32"],
            SbatchOptions(time="2 hours"),
            Path(REPO_ROOT),
            out=str(tmp_path / "bad.sbatch"),
        )
    assert not (tmp_path / "bad.sbatch").exists()
