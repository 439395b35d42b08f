"""A sweep from its command line (`dcp-bench sweep`): the grid planned, then listed (a dry run),
run here (`dcp_bench.campaign.sweep`) or submitted to Slurm (`dcp_bench.campaign.slurm`), and
summed up in a few lines with the exit status.

Exit status: 0 when every run of the grid holds an ``ok`` record (or the runs were submitted
and not waited for), `EXIT_RUN_FAILED` when any run failed (its record kept; every failed run
listed)."""

from __future__ import annotations

from collections.abc import Sequence

from dcp_bench.campaign.slurm import run_sweep_slurm, split_launcher
from dcp_bench.campaign.sweep import SweepResult, plan_sweep, record_state, run_sweep
from dcp_bench.run.spec import RunSpec

# Exit status of a sweep in which a run did not finish ``ok``.
EXIT_RUN_FAILED = 3


def launch_sweep(
    overrides: Sequence[str],
    jobs: int = 1,
    resume: bool = True,
    retry_failed: bool = False,
    progress: bool = True,
    dry_run: bool = False,
) -> int:
    """Plan the grid the overrides describe (``launcher=`` and ``slurm.*`` keys choose where it
    runs) and run it, or with ``dry_run`` list its runs; the exit status."""
    launcher, slurm, grid = split_launcher(list(overrides))
    specs = plan_sweep(grid)
    if not specs:
        print("no runs in this grid")
        return 0
    if dry_run:
        list_runs(specs)
        return 0
    if launcher == "slurm":
        res = run_sweep_slurm(specs, slurm, resume=resume, retry_failed=retry_failed)
        if res.unrun:
            print(
                f"{len(res.unrun)} run(s) submitted, {len(res.skipped)} already complete; rerun "
                "this command to resume: it resubmits the runs not done and reports the finished "
                "ones"
            )
            return 0
    else:
        res = run_sweep(
            specs, resume=resume, jobs=jobs, progress=progress, retry_failed=retry_failed
        )
    return sum_up(specs, res)


def list_runs(specs: Sequence[RunSpec]) -> None:
    """One line per run: its state (todo, done, damaged, failed:STATUS) and its id."""
    for s in specs:
        _, state = record_state(s)
        word = {"incomplete": "todo", "damaged": "damaged"}.get(state.state, "done")
        if state.failed and state.summary is not None:
            word = f"failed:{state.summary.status}"
        print(f"{word:<16} {s.run_id}")


def sum_up(specs: Sequence[RunSpec], res: SweepResult) -> int:
    """The sweep's counts, where its records are, its failed runs; the exit status."""
    places = sorted({f"{s.root}/{s.campaign}" for s in specs})
    campaign, root = specs[0].campaign, specs[0].root
    failed = res.all_failed
    print(
        f"{len(res.ran)} run(s) done, {len(res.skipped)} already complete, {len(res.damaged)} "
        f"damaged record(s) redone, {len(failed)} failed; records in {', '.join(places)}; report: "
        f"dcp-bench report campaign={campaign} root={root}"
    )
    if failed:
        print(
            f"failed runs ({len(res.failed)} now, {len(res.kept_failed)} kept from before"
            f"{'; rerun with --retry-failed to redo them' if res.kept_failed else ''}):"
        )
        for bad in failed:
            print(f"  {bad.status}: {bad.run_id}: {bad.error}")
        return EXIT_RUN_FAILED
    return 0
