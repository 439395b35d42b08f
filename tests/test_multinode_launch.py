"""Multi-node launch on one CPU machine: the sbatch script `dcp-bench slurm` writes, run with
stand-ins for Slurm's ``scontrol`` and ``srun`` (srun starts its command once per node, here as
local processes), starts two node launchers (`dcp-bench train ... nnodes=2
rdzv_endpoint=127.0.0.1:PORT`) whose torchruns meet at the c10d rendezvous; the run's losses equal
those of one node with the same world size (2 gloo ranks)."""

from __future__ import annotations

import os
import socket
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from dcp_bench.paths import REPO_ROOT
from dcp_bench.records import read_summary
from dcp_bench.run.spec import parse_run_spec
from dcp_bench.run.torch_run import launch_torch_run
from dcp_bench.run.train_config import resolve_train_config

pytestmark = [
    pytest.mark.dist,
    pytest.mark.slow,
    pytest.mark.timeout(900),
]  # three torchrun launches

RUN = [
    "workload=synthetic_uniform",
    "workload.low=16",
    "workload.high=200",
    "workload.tokens_per_gpu=400",
    "method=bucket_static",
    "model=tiny_llama",
    "steps=2",
    "warmup_steps=1",
    "seed=5",
    "train.pg_timeout_s=60",
    "timeout_s=300",
]

SCONTROL = """#!/bin/sh
# stand-in: every node of the allocation is this machine
echo 127.0.0.1
"""
SRUN = """#!/bin/bash
# stand-in: start the command once per node (--nodes=N), as local processes, and wait for all
nodes=1
while [ $# -gt 0 ]; do
  case "$1" in
    --nodes=*) nodes="${1#--nodes=}"; shift ;;
    --*) shift ;;
    *) break ;;
  esac
done
pids=()
for ((i = 0; i < nodes; i++)); do SLURM_NODEID=$i SLURM_PROCID=$i "$@" & pids+=($!); done
status=0
for p in "${pids[@]}"; do wait "$p" || status=$?; done
exit $status
"""


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_two_node_launchers_from_the_sbatch_script_equal_one_node(tmp_path: Path) -> None:
    one = launch_torch_run(
        parse_run_spec(
            resolve_train_config(
                [*RUN, "cluster=cpu", "nproc=2", f"root={tmp_path / 'one'}", "campaign=c"]
            )
        )
    )
    assert one.status == "ok", one.error

    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for name, text in (("scontrol", SCONTROL), ("srun", SRUN)):
        path = bin_dir / name
        path.write_text(text)
        path.chmod(path.stat().st_mode | stat.S_IEXEC)
    script = tmp_path / "job.sbatch"
    two_root = tmp_path / "two"
    gen = subprocess.run(
        [
            sys.executable,
            "-m",
            "dcp_bench.cli",
            "slurm",
            "cluster=cpu",
            "++cluster.num_nodes=2",
            "++cluster.gpus_per_node=1",
            *RUN,
            f"root={two_root}",
            "campaign=c",
            "--port",
            str(_free_port()),
            "--python",
            sys.executable,
            "--out",
            str(script),
        ],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=REPO_ROOT,
    )
    assert gen.returncode == 0, gen.stderr
    text = script.read_text()
    assert "#SBATCH --nodes=2" in text and "nnodes=2" in text
    env = {
        **os.environ,
        "PATH": f"{bin_dir}:{os.environ['PATH']}",
        "SLURM_JOB_NODELIST": "node[1-2]",
        "SLURM_JOB_NUM_NODES": "2",
        "SLURM_JOB_ID": "4242",
        "OMP_NUM_THREADS": "1",
    }
    job = subprocess.run(
        ["bash", str(script)], capture_output=True, text=True, timeout=900, env=env
    )
    assert job.returncode == 0, job.stdout[-3000:] + job.stderr[-3000:]
    assert "rendezvous 127.0.0.1:" in job.stdout
    two = read_summary(two_root / "c" / _run_id(two_root))
    assert two is not None and two.status == "ok"
    assert two.training is not None and one.training is not None
    assert two.training.losses == one.training.losses
    assert two.training.grad_norms == one.training.grad_norms
    assert two.n_steps == one.n_steps == 2


def _run_id(root: Path) -> str:
    runs = [p.name for p in (root / "c").iterdir() if p.is_dir()]
    assert len(runs) == 1, runs
    return runs[0]
