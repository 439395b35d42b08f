"""A ready sbatch script for one multi-node real run (what ``dcp-bench slurm`` writes).

The script asks Slurm for the cluster's nodes (one task per node, all its GPUs), takes the first
node of the allocation as the torchrun rendezvous host, and runs on every node (``srun``) the same
``dcp-bench train`` command with ``nnodes=N rdzv_endpoint=HOST:PORT train.rdzv_id=$SLURM_JOB_ID``;
each node's launcher then starts ``torchrun --nnodes N --rdzv-backend c10d --rdzv-endpoint
HOST:PORT --nproc-per-node G`` (`dcp_bench.run.spec.TrainSettings.torchrun_args`). The run's
config is checked here (`dcp_bench.run.train_config.resolve_train_config`, as ``dcp-bench train``
resolves it on the nodes), before the job is queued. A sweep's runs as a Slurm job array are
`dcp_bench.campaign.slurm`.
"""

from __future__ import annotations

import re
import shlex
from dataclasses import dataclass, field
from pathlib import Path

from dcp_bench.errors import ConfigError
from dcp_bench.files import atomic_write_text, check_output
from dcp_bench.run.spec import RunSpec, parse_run_spec
from dcp_bench.run.train_config import resolve_train_config

# Slurm's --time formats: MM, MM:SS, HH:MM:SS, D-HH, D-HH:MM, D-HH:MM:SS (or UNLIMITED).
SLURM_TIME = (
    r"(\d+|\d+:\d{1,2}|\d+:\d{1,2}:\d{1,2}"
    r"|\d+-\d+|\d+-\d+:\d{1,2}|\d+-\d+:\d{1,2}:\d{1,2}"
    r"|UNLIMITED|INFINITE)"
)
SLURM_NAME = r"[A-Za-z0-9_.,:+-]{1,128}"


@dataclass(frozen=True)
class SbatchOptions:
    """The job's settings beside the run's overrides (the ``dcp-bench slurm`` flags)."""

    time: str = "02:00:00"
    partition: str | None = None
    account: str | None = None
    port: int = 29500  # the rendezvous port on the first node
    cpus_per_node: int | None = None
    python: str | None = (
        None  # default: the repository's .venv/bin/python when it exists, else python3
    )
    setup: tuple[str, ...] = field(
        default_factory=tuple
    )  # shell lines run before training on every node


def _check_port(port: int) -> int:
    if not 1024 <= port <= 65535:
        raise ConfigError(f"--port {port}: expected a port in 1024..65535")
    return port


def check_slurm_keys(options: SbatchOptions) -> None:
    """Every value written into the script's ``#SBATCH`` lines checked first (a bad one is a
    `ConfigError` naming it, not a script Slurm refuses later, or a line that says more)."""
    if not re.fullmatch(SLURM_TIME, str(options.time)):
        raise ConfigError(
            f"--time {options.time!r}: expected a Slurm time limit (MM, HH:MM:SS, D-HH:MM:SS ...)"
        )
    for flag, value in (("--partition", options.partition), ("--account", options.account)):
        if value is not None and not re.fullmatch(SLURM_NAME, value):
            raise ConfigError(
                f"{flag} {value!r}: expected a Slurm name (letters, digits and _.,:+-)"
            )
    if options.cpus_per_node is not None and options.cpus_per_node < 1:
        raise ConfigError(f"--cpus-per-node {options.cpus_per_node}: expected an integer >= 1")
    for line in options.setup:
        if "\n" in line or "\r" in line:
            raise ConfigError(
                f"--setup {line!r}: expected one shell line (give --setup once per line)"
            )


def sbatch_script(overrides: list[str], options: SbatchOptions, repo: Path) -> tuple[str, RunSpec]:
    """The script text and the parsed `RunSpec` of one node's run."""
    check_slurm_keys(options)
    keys = {ov.partition("=")[0].lstrip("+~") for ov in overrides}
    if "cluster" not in keys:
        raise ConfigError(
            "slurm needs cluster=NAME (a GPU cluster config, e.g. cluster=h200x32): it sizes the "
            "job"
        )
    reserved = keys & {
        "nnodes",
        "train.nnodes",
        "rdzv_endpoint",
        "train.rdzv_endpoint",
        "train.rdzv_id",
    }
    if reserved:
        raise ConfigError(
            f"slurm sets {', '.join(sorted(reserved))} itself (from the allocation); drop it"
        )
    port = _check_port(options.port)
    # The cluster (resized by nproc=) says how many nodes; the node's run is then checked as the
    # job will run it (the rendezvous host is known only inside the allocation).
    cluster = parse_run_spec(resolve_train_config(overrides)).cluster
    nnodes, gpus = cluster.num_nodes, cluster.gpus_per_node
    spec = parse_run_spec(
        resolve_train_config([*overrides, f"nnodes={nnodes}", f"rdzv_endpoint=localhost:{port}"])
    )
    python = options.python or (
        str(repo / ".venv" / "bin" / "python")
        if (repo / ".venv" / "bin" / "python").exists()
        else "python3"
    )
    job = f"dcp-bench-{spec.method_name}-{spec.workload_name}"[:64]
    train = [
        f"{shlex.quote(python)} -m dcp_bench.cli train",
        *(shlex.quote(o) for o in overrides),
        f"nnodes={nnodes}",
        '"rdzv_endpoint=${RDZV_HOST}:${RDZV_PORT}"',
        '"train.rdzv_id=${SLURM_JOB_ID}"',
    ]
    lines = [
        "#!/bin/bash",
        f"# Written by `dcp-bench slurm {' '.join(shlex.quote(o) for o in overrides)}`",
        f"# Run {spec.run_id}: {spec.world_size} ranks = {nnodes} node(s) x {gpus} GPU(s), "
        f"cluster {spec.cluster.name};",
        f"# records under {spec.root}/{spec.campaign}/ on the node of rank 0 (use a shared "
        "filesystem).",
        f"#SBATCH --job-name={job}",
        f"#SBATCH --nodes={nnodes}",
        "#SBATCH --ntasks-per-node=1",
        f"#SBATCH --gpus-per-node={gpus}",
        f"#SBATCH --time={options.time}",
        "#SBATCH --exclusive",
        f"#SBATCH --output={job}-%j.out",
    ]
    if options.partition:
        lines.append(f"#SBATCH --partition={options.partition}")
    if options.account:
        lines.append(f"#SBATCH --account={options.account}")
    if options.cpus_per_node:
        lines.append(f"#SBATCH --cpus-per-task={options.cpus_per_node}")
    lines += [
        "set -euo pipefail",
        f"cd {shlex.quote(str(repo))}",
        *options.setup,
        "# The torchrun rendezvous (c10d) is hosted by the first node of the allocation.",
        'RDZV_HOST=$(scontrol show hostnames "$SLURM_JOB_NODELIST" | head -n 1)',
        f"RDZV_PORT={port}",
        'echo "dcp-bench: ${SLURM_JOB_NUM_NODES} node(s), rendezvous ${RDZV_HOST}:${RDZV_PORT}"',
        "# One task per node: each runs dcp-bench train, which starts torchrun for its node's "
        "GPUs.",
        f"srun --nodes={nnodes} --ntasks-per-node=1 --kill-on-bad-exit=1 \\",
        "    " + " \\\n    ".join(train),
        "",
    ]
    return "\n".join(lines), spec


def write_sbatch_script(
    overrides: list[str], options: SbatchOptions, repo: Path, out: str | None = None
) -> tuple[Path, RunSpec]:
    """Write the script to ``out`` (default ``slurm/<run id>.sbatch``): the path written and the
    node's `RunSpec`. A bad ``out`` is refused before the run's config is resolved."""
    if out:
        check_output(out, "--out", folder=False)
    text, spec = sbatch_script(overrides, options, repo)
    path = Path(out) if out else Path("slurm") / f"{spec.run_id}.sbatch"
    check_output(path, "--out", folder=False)
    atomic_write_text(path, text)
    return path, spec
