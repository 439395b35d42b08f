"""One rank of a real run: what ``python -m dcp_bench.run.torch_rank --spec FILE`` runs under
torchrun (RANK, WORLD_SIZE, LOCAL_RANK set), started by `dcp_bench.run.torch_run.launch_torch_run`.

`worker_main` initialises the process group (with ``train.pg_timeout_s``), parses the same
`RunSpec`, assembles the same parts, builds the runtime's `TorchExecutor` (model, optimizer,
process-group pool) and runs `execute_run`; rank 0 writes the records, as the owner the launcher
named. A rank that raises writes its exception on one stderr line after `RANK_ERROR_MARK` and
exits non-zero. The launcher lives in its own module, which never imports torch.
"""

from __future__ import annotations

import argparse
import json
import time
from datetime import timedelta
from pathlib import Path

import torch
import torch.distributed as dist

from dcp_bench.envinfo import collect_env
from dcp_bench.records import RunWriter
from dcp_bench.run.assemble import assemble
from dcp_bench.run.loop import execute_run
from dcp_bench.run.spec import RunSpec
from dcp_bench.run.torch_run import TrainError, spec_from_payload, write_rank_error
from dcp_bench.runtime.device import backend_for, pick_device
from dcp_bench.runtime.executor import TorchExecutor
from dcp_bench.runtime.groups import ProcessGroupPool
from dcp_bench.runtime.training import build_training_state


def worker_main(
    spec: RunSpec, owner: str | None = None, previous_attempt: str | None = None
) -> int:
    """One rank of a real run (started by torchrun: RANK, WORLD_SIZE, LOCAL_RANK set). ``owner``:
    the token the launcher claimed the run folder with; rank 0 writes only while it holds."""
    torch.set_num_threads(spec.train.threads)
    device = pick_device(spec.train.device)
    backend = backend_for(spec.train.backend, device)
    dist.init_process_group(backend, timeout=timedelta(seconds=spec.train.pg_timeout_s))
    started = time.time()
    try:
        rank, world = dist.get_rank(), dist.get_world_size()
        if world != spec.world_size:
            raise TrainError(
                f"{world} ranks launched for a run of {spec.world_size} (cluster "
                f"{spec.cluster.name})"
            )
        writer = RunWriter(
            spec.root,
            spec.campaign,
            spec.run_id,
            dict(spec.config),
            env=collect_env() if rank == 0 else None,
            enabled=rank == 0,
            owner=owner,
        )
        pool = ProcessGroupPool(timeout_s=spec.train.pg_timeout_s)
        # The run's ZeRO stage, the one its cost model prices.
        state = build_training_state(
            spec.model, spec.seed, device, spec.train.lr, zero_stage=spec.zero_stage
        )
        executor = TorchExecutor(
            state,
            None,
            pool,
            seed=spec.seed,
            grad_clip=spec.train.grad_clip,
            fail_rank=spec.train.fail_rank,
            fail_step=spec.train.fail_step,
            backend=backend,
        )
        executor.info.update({"lr": spec.train.lr})
        if previous_attempt:  # the launcher's first attempt died without a rank's exception
            executor.info["previous_attempt"] = previous_attempt
        summary = execute_run(spec, assemble(spec), executor, writer, started)
        # Every rank reaches the teardown together: a rank tearing its process group down while a
        # peer still uses it can abort in gloo's destructor ("terminate called without an active
        # exception"), after the run is complete and recorded.
        dist.barrier()
        return 0 if summary.status == "ok" else 3
    finally:
        dist.destroy_process_group()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description="one rank of a dcp-bench real run (started by torchrun)"
    )
    parser.add_argument("--spec", required=True)
    args = parser.parse_args(argv)
    try:
        payload = json.loads(Path(args.spec).read_text())
        return worker_main(
            spec_from_payload(payload),
            owner=payload.get("owner"),
            previous_attempt=payload.get("previous_attempt"),
        )
    except Exception as exc:
        write_rank_error(exc)
        return 1


if __name__ == "__main__":
    raise SystemExit(main())
