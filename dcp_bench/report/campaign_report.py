"""A campaign's run records -> its report folder (what ``dcp-bench report`` writes), with the checks
that refuse a report that would say nothing: `report_campaign` checks the output folder, that the
campaign holds complete runs, and that every baseline asked for is a method the campaign ran,
then writes the report (`dcp_bench.report.writer.build_report`)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from dcp_bench.errors import ConfigError
from dcp_bench.files import check_output
from dcp_bench.paths import RESULTS_DIR
from dcp_bench.records import RecordError, iter_run_dirs, list_runs, read_summary
from dcp_bench.report.writer import ReportInputs, build_report, default_out_dir

DEFAULT_CLAIMS = RESULTS_DIR / "reference" / "claims.yaml"


def check_baselines(baselines: Sequence[str], root: str, campaign: str) -> None:
    """Every name in ``baselines`` is a method the campaign ran (else the report would hold no
    comparison and say nothing)."""
    methods: set[str] = set()
    for run_dir in iter_run_dirs(root, campaign):
        try:
            summary = read_summary(run_dir)
        except RecordError:
            continue  # named by the report
        if summary is not None:
            methods.add(summary.method)
    unknown = [b for b in baselines if b not in methods]
    if unknown:
        raise ConfigError(
            f"baselines={','.join(baselines)}: campaign {campaign!r} has no runs of method "
            f"{unknown[0]!r}; expected methods from {', '.join(sorted(methods)) or '-'}"
        )


def report_campaign(
    campaign: str = "default",
    root: str = "runs",
    out: str | None = None,
    claims: str | None = None,
    baselines: list[str] | None = None,
    baseline_pairs: bool = False,
    n_boot: int = 2000,
    command: str | None = None,
) -> dict[str, Any]:
    """Write the report of ``root``/``campaign`` to ``out`` (default ``reports/<campaign>/``) and
    return its summary (also written as summary.json). ``claims`` defaults to the reference
    claims; ``command`` is the command line the report names (default ``dcp-bench report
    campaign=NAME``). A `ConfigError` before anything is written when ``out`` cannot be written,
    the campaign has no complete run, or a baseline is not one of its methods."""
    out_dir = out if out is not None else str(default_out_dir(campaign))
    check_output(out_dir, "out")
    runs = list_runs(root, campaign)
    if not runs["complete"]:
        raise ConfigError(
            f"campaign {campaign!r} under {root!r} has no complete runs; run `dcp-bench sweep "
            f"run.campaign={campaign}` first"
        )
    if baselines is not None:
        check_baselines(baselines, root, campaign)
    return build_report(
        ReportInputs(
            root=root,
            campaign=campaign,
            out_dir=out_dir,
            claims_path=claims if claims is not None else str(DEFAULT_CLAIMS),
            command=command if command is not None else f"dcp-bench report campaign={campaign}",
            baselines=baselines,
            baseline_pairs=baseline_pairs,
            n_boot=n_boot,
        )
    )
