"""One run from its command line, as ``dcp-bench train`` and ``dcp-bench simulate`` start it: the
config parsed into a `RunSpec`, everything that can refuse the run checked before anything runs,
the run folder's execution lock taken (one process at a time executes a run id,
`dcp_bench.records.executing`), then the one run path (`dcp_bench.run`)."""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from pathlib import Path

from dcp_bench.campaign.sweep import check_run_places
from dcp_bench.config import load_config, to_container
from dcp_bench.errors import ConfigError
from dcp_bench.records import RunSummary, executing
from dcp_bench.run.assemble import assemble
from dcp_bench.run.memory_precheck import check_memory_fits
from dcp_bench.run.simulated import run_simulated
from dcp_bench.run.spec import RunSpec, parse_run_spec
from dcp_bench.run.torch_run import check_local_ranks, launch_torch_run
from dcp_bench.run.train_config import resolve_train_config, run_device


def train_one(overrides: list[str], say: Callable[[str], None]) -> tuple[RunSpec, RunSummary]:
    """A real run (torchrun underneath) of the config ``overrides`` compose
    (`resolve_train_config`): refused with a `ConfigError` before any process starts when this
    node cannot run its ranks, its records cannot be written, or its plans need more memory than
    this machine has; ``say`` gets the notes on how the config was completed."""
    notes: list[str] = []
    spec = parse_run_spec(resolve_train_config(overrides, notes))
    check_local_ranks(spec)
    check_run_places([spec])
    check_memory_fits(spec, run_device(spec))
    for note in notes:
        say(note)
    # each node's launcher of a multi-node run holds the lock shared (`records.try_lock_run`)
    with executing(
        Path(spec.root) / spec.campaign / spec.run_id, say=say, shared=spec.train.nnodes > 1
    ):
        summary = launch_torch_run(spec)
    return spec, summary


def simulate_one(
    overrides: list[str], record: bool, say: Callable[[str], None]
) -> tuple[RunSpec, RunSummary]:
    """A simulated run of the config ``overrides`` compose; with ``record`` its run records are
    written (as a sweep writes them) under the run folder's execution lock. A bad config is a
    `ConfigError` before any step runs."""
    spec = parse_run_spec(to_container(load_config(overrides)))
    if record:
        check_run_places([spec])
    if spec.executor != "sim":
        raise ConfigError(
            f"run.executor={spec.executor!r}: simulate runs the simulator; use `dcp-bench train` "
            "for real runs"
        )
    parts = assemble(spec)  # a bad config fails here, on one line, before anything runs
    with contextlib.ExitStack() as stack:
        if record:
            stack.enter_context(executing(Path(spec.root) / spec.campaign / spec.run_id, say=say))
        summary = run_simulated(spec, build=lambda _: parts, write=record)
    return spec, summary
