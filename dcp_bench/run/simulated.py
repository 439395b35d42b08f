"""A simulated run: the run's parts, the simulator as executor, the one step loop."""

from __future__ import annotations

import time
from typing import Any

from dcp_bench.records import RunSummary, RunWriter
from dcp_bench.run.assemble import Assemble, assemble
from dcp_bench.run.loop import execute_run
from dcp_bench.run.spec import RunSpec
from dcp_bench.sim import SimExecutor


def run_simulated(
    spec: RunSpec,
    build: Assemble = assemble,
    env: dict[str, Any] | None = None,
    write: bool = True,
) -> RunSummary:
    """Simulate ``spec`` and (with ``write``) record it under ``<root>/<campaign>/<run_id>/``.
    Failures become the run's status, never an exception (except KeyboardInterrupt, which leaves
    the run incomplete for a resumed sweep to redo). ``build`` replaces the assembly (tests bind
    small stand-ins)."""
    writer = RunWriter(
        spec.root, spec.campaign, spec.run_id, config=dict(spec.config), env=env, enabled=write
    )
    started = time.time()
    try:
        parts = build(spec)
        executor = SimExecutor(parts.cost, parts.noise)
    except KeyboardInterrupt:
        raise
    except Exception as exc:
        return execute_run(spec, None, None, writer, started, setup_error=exc)
    return execute_run(spec, parts, executor, writer, started)
