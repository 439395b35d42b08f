"""`dcp-bench slurm`: a ready sbatch script for a multi-node `dcp-bench train` run.

The script asks Slurm for the cluster's nodes and runs ``dcp-bench train`` on every node with the
torchrun rendezvous on the first node of the allocation. The command parses its arguments and
calls `dcp_bench.campaign.sbatch.write_sbatch_script` (its module docstring says what the script
does); the run's config is checked before the job is queued.
"""

from __future__ import annotations

import argparse
from pathlib import Path

NAME = "slurm"
HELP = (
    "write an sbatch script for a multi-node real run: `dcp-bench slurm workload=W method=M "
    "model=X cluster=h200x32 steps=N root=/shared/runs [--out job.sbatch] [--partition P] "
    "[--account A] [--time HH:MM:SS]`; the job runs `dcp-bench train` on every node with the "
    "torchrun rendezvous on the first node"
)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "overrides", nargs="*", help="key=value overrides of `dcp-bench train` (cluster= required)"
    )
    parser.add_argument("--out", default=None, help="script path (default: slurm/<run id>.sbatch)")
    parser.add_argument("--partition", default=None, help="#SBATCH --partition")
    parser.add_argument("--account", default=None, help="#SBATCH --account")
    parser.add_argument("--time", default="02:00:00", help="#SBATCH --time (default 02:00:00)")
    parser.add_argument(
        "--port", type=int, default=29500, help="rendezvous port on the first node (29500)"
    )
    parser.add_argument(
        "--cpus-per-node", type=int, default=None, help="#SBATCH --cpus-per-task (default: Slurm's)"
    )
    parser.add_argument(
        "--python",
        default=None,
        help="the Python that runs dcp-bench on the nodes (default: this repository's "
        ".venv/bin/python when it exists, else python3)",
    )
    parser.add_argument(
        "--setup",
        action="append",
        default=[],
        help="a shell line run before training on every node (module load, source ...); repeatable",
    )


def run(args: argparse.Namespace) -> int:
    from dcp_bench.campaign.sbatch import SbatchOptions, write_sbatch_script
    from dcp_bench.paths import REPO_ROOT

    options = SbatchOptions(
        time=args.time,
        partition=args.partition,
        account=args.account,
        port=args.port,
        cpus_per_node=args.cpus_per_node,
        python=args.python,
        setup=tuple(args.setup),
    )
    out, spec = write_sbatch_script(list(args.overrides), options, Path(REPO_ROOT), out=args.out)
    print(
        f"wrote {out}: {spec.cluster.num_nodes} node(s) x {spec.cluster.gpus_per_node} GPU(s); "
        f"submit with: sbatch {out}"
    )
    return 0
