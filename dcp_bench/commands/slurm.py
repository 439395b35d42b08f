"""`dcp-bench slurm`: a ready sbatch script for a multi-node `dcp-bench train` run.

The script asks Slurm for the cluster's nodes (one task per node, all its GPUs), takes the first
node of the allocation as the torchrun rendezvous host, and runs on every node (``srun``) the same
``dcp-bench train`` command with ``nnodes=N rdzv_endpoint=HOST:PORT train.rdzv_id=$SLURM_JOB_ID``;
each node's launcher then starts ``torchrun --nnodes N --rdzv-backend c10d --rdzv-endpoint
HOST:PORT --nproc-per-node G`` (`dcp_bench.run.spec.TrainSettings.torchrun_args`). No Python to
write: the run's config is checked here, before the job is queued.
"""

from __future__ import annotations

import argparse
import shlex
from pathlib import Path
from typing import Any

NAME = "slurm"
HELP = (
    "write an sbatch script for a multi-node real run: `dcp-bench slurm workload=W method=M model=X "
    "cluster=h200x32 steps=N root=/shared/runs [--out job.sbatch] [--partition P] [--account A] "
    "[--time HH:MM:SS]`; the job runs `dcp-bench train` on every node with the torchrun rendezvous "
    "on the first node"
)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("overrides", nargs="*", help="key=value overrides of `dcp-bench train` (cluster= required)")
    parser.add_argument("--out", default=None, help="script path (default: slurm/<run id>.sbatch)")
    parser.add_argument("--partition", default=None, help="#SBATCH --partition")
    parser.add_argument("--account", default=None, help="#SBATCH --account")
    parser.add_argument("--time", default="02:00:00", help="#SBATCH --time (default 02:00:00)")
    parser.add_argument("--port", type=int, default=29500, help="rendezvous port on the first node (29500)")
    parser.add_argument("--cpus-per-node", type=int, default=None, help="#SBATCH --cpus-per-task (default: Slurm's)")
    parser.add_argument("--python", default=None,
                        help="the Python that runs dcp-bench on the nodes (default: this repository's "
                        ".venv/bin/python when it exists, else python3)")
    parser.add_argument("--setup", action="append", default=[],
                        help="a shell line run before training on every node (module load, source ...); repeatable")


def _check_port(port: int) -> int:
    from dcp_bench.errors import ConfigError

    if not 1024 <= port <= 65535:
        raise ConfigError(f"--port {port}: expected a port in 1024..65535")
    return port


# Slurm's --time formats: MM, MM:SS, HH:MM:SS, D-HH, D-HH:MM, D-HH:MM:SS (or UNLIMITED).
SLURM_TIME = r"(\d+|\d+:\d{1,2}|\d+:\d{1,2}:\d{1,2}|\d+-\d+|\d+-\d+:\d{1,2}|\d+-\d+:\d{1,2}:\d{1,2}|UNLIMITED|INFINITE)"
SLURM_NAME = r"[A-Za-z0-9_.,:+-]{1,128}"


def check_slurm_keys(args: argparse.Namespace) -> None:
    """Every value written into the script's ``#SBATCH`` lines checked first (a bad one is a
    `ConfigError` naming it, not a script Slurm refuses later, or a line that says more)."""
    import re

    from dcp_bench.errors import ConfigError

    if not re.fullmatch(SLURM_TIME, str(args.time)):
        raise ConfigError(f"--time {args.time!r}: expected a Slurm time limit (MM, HH:MM:SS, D-HH:MM:SS ...)")
    for flag, value in (("--partition", args.partition), ("--account", args.account)):
        if value is not None and not re.fullmatch(SLURM_NAME, value):
            raise ConfigError(f"{flag} {value!r}: expected a Slurm name (letters, digits and _.,:+-)")
    if args.cpus_per_node is not None and args.cpus_per_node < 1:
        raise ConfigError(f"--cpus-per-node {args.cpus_per_node}: expected an integer >= 1")
    for line in args.setup:
        if "\n" in line or "\r" in line:
            raise ConfigError(f"--setup {line!r}: expected one shell line (give --setup once per line)")


def sbatch_script(overrides: list[str], args: argparse.Namespace, repo: Path) -> tuple[str, Any]:
    """The script text and the parsed `RunSpec` of one node's run."""
    from dcp_bench.commands.train import resolve_train_config
    from dcp_bench.errors import ConfigError
    from dcp_bench.run.spec import parse_run_spec

    check_slurm_keys(args)
    keys = {ov.partition("=")[0].lstrip("+~") for ov in overrides}
    if "cluster" not in keys:
        raise ConfigError("slurm needs cluster=NAME (a GPU cluster config, e.g. cluster=h200x32): it sizes the job")
    reserved = keys & {"nnodes", "train.nnodes", "rdzv_endpoint", "train.rdzv_endpoint", "train.rdzv_id"}
    if reserved:
        raise ConfigError(f"slurm sets {', '.join(sorted(reserved))} itself (from the allocation); drop it")
    port = _check_port(args.port)
    # The cluster (resized by nproc=) says how many nodes; the node's run is then checked as the
    # job will run it (the rendezvous host is known only inside the allocation).
    cluster = parse_run_spec(resolve_train_config(overrides)).cluster
    nnodes, gpus = cluster.num_nodes, cluster.gpus_per_node
    spec = parse_run_spec(resolve_train_config([*overrides, f"nnodes={nnodes}", f"rdzv_endpoint=localhost:{port}"]))
    python = args.python or (str(repo / ".venv" / "bin" / "python") if (repo / ".venv" / "bin" / "python").exists()
                             else "python3")
    job = f"dcp-bench-{spec.method_name}-{spec.workload_name}"[:64]
    train = [f"{shlex.quote(python)} -m dcp_bench.cli train", *(shlex.quote(o) for o in overrides),
             f"nnodes={nnodes}", '"rdzv_endpoint=${RDZV_HOST}:${RDZV_PORT}"', '"train.rdzv_id=${SLURM_JOB_ID}"']
    lines = [
        "#!/bin/bash",
        f"# Written by `dcp-bench slurm {' '.join(shlex.quote(o) for o in overrides)}`",
        f"# Run {spec.run_id}: {spec.world_size} ranks = {nnodes} node(s) x {gpus} GPU(s), cluster {spec.cluster.name};",
        f"# records under {spec.root}/{spec.campaign}/ on the node of rank 0 (use a shared filesystem).",
        f"#SBATCH --job-name={job}",
        f"#SBATCH --nodes={nnodes}",
        "#SBATCH --ntasks-per-node=1",
        f"#SBATCH --gpus-per-node={gpus}",
        f"#SBATCH --time={args.time}",
        "#SBATCH --exclusive",
        f"#SBATCH --output={job}-%j.out",
    ]
    if args.partition:
        lines.append(f"#SBATCH --partition={args.partition}")
    if args.account:
        lines.append(f"#SBATCH --account={args.account}")
    if args.cpus_per_node:
        lines.append(f"#SBATCH --cpus-per-task={args.cpus_per_node}")
    lines += [
        "set -euo pipefail",
        f"cd {shlex.quote(str(repo))}",
        *args.setup,
        "# The torchrun rendezvous (c10d) is hosted by the first node of the allocation.",
        'RDZV_HOST=$(scontrol show hostnames "$SLURM_JOB_NODELIST" | head -n 1)',
        f"RDZV_PORT={port}",
        'echo "dcp-bench: ${SLURM_JOB_NUM_NODES} node(s), rendezvous ${RDZV_HOST}:${RDZV_PORT}"',
        "# One task per node: each runs dcp-bench train, which starts torchrun for its node's GPUs.",
        f"srun --nodes={nnodes} --ntasks-per-node=1 --kill-on-bad-exit=1 \\",
        "    " + " \\\n    ".join(train),
        "",
    ]
    return "\n".join(lines), spec


def run(args: argparse.Namespace) -> int:
    from dcp_bench.files import atomic_write_text, check_output
    from dcp_bench.paths import REPO_ROOT

    if args.out:
        check_output(args.out, "--out", folder=False)
    text, spec = sbatch_script(list(args.overrides), args, Path(REPO_ROOT))
    out = Path(args.out) if args.out else Path("slurm") / f"{spec.run_id}.sbatch"
    check_output(out, "--out", folder=False)
    atomic_write_text(out, text)
    print(f"wrote {out}: {spec.cluster.num_nodes} node(s) x {spec.cluster.gpus_per_node} GPU(s); submit with: sbatch {out}")
    return 0
