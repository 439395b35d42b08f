"""The claim reproduction (`dcp-bench reproduce`, `make reproduce`): the sections of a reproduce
config (`dcp_bench.campaign.reproduce_config`) run as sweeps, then the report.

Sections run in order, each under its own time budget and all under the command's budget; a
budget bounds running runs too (a run it cuts is recorded as ``timeout`` naming the budget), and
the runs a budget leaves out are named in the report, never silently dropped. The report is
written to a temporary folder beside ``out`` and replaces ``out`` only once it is complete, so an
interrupted or failed reproduction leaves the previous report whole. Resumable: a rerun skips
complete runs, keeps failed ones (``retry_failed=true`` redoes them) and redoes damaged ones
(delete ``runs/reproduce`` for a fresh start).

Completeness: a section is complete when every run it asked for holds a record and none was cut
or left out by the time budget. When any section is not, the reproduction says so ("incomplete:
N of M sections, rerun `make reproduce` to resume"), writes its report beside ``out``
(``<out>.partial/``) so the last complete report stays, and returns `EXIT_INCOMPLETE`;
``summary.json`` carries ``completeness`` either way. The budget bounds the whole command, the
report included: a report not finished when it runs out is stopped, and the reproduction is
incomplete. ``out`` and ``root`` are checked before any run starts; the claims file is found
from any folder (relative paths also against the repository).
"""

from __future__ import annotations

import json
import multiprocessing as mp
import os
import shlex
import shutil
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from dcp_bench.campaign.reproduce_config import (
    ReproduceConfig,
    ReproduceSection,
    find_claims,
    load_reproduce_config,
)
from dcp_bench.campaign.sweep import SweepResult, plan_sweep, progress_mode, run_sweep
from dcp_bench.envinfo import collect_env
from dcp_bench.errors import ConfigError, DcpBenchError
from dcp_bench.files import atomic_write_json, check_output
from dcp_bench.records import RunSummary
from dcp_bench.report.writer import ReportInputs, build_report, shown_path
from dcp_bench.run.spec import CAMPAIGN_NAME, RunSpec

EXIT_INCOMPLETE = 4  # a section was cut or not run: the report is written beside out, not over it
INCOMPLETE = "incomplete: {done} of {total} sections, rerun `make reproduce` to resume"


@dataclass
class Progress:
    """What the reproduction has done so far: the notes its report shows, the sections it set
    out to run and those of them not done in full."""

    notes: list[str] = field(default_factory=list)
    wanted: list[str] = field(default_factory=list)
    cut: list[str] = field(default_factory=list)


@dataclass
class SectionTally:
    """The runs of one section, over its real and simulated sweeps."""

    ran: int = 0
    skipped: int = 0
    damaged: int = 0
    unrun: list[str] = field(default_factory=list)
    failed: list[str] = field(default_factory=list)
    budget_cut: list[str] = field(default_factory=list)
    not_run: str = ""  # why the real runs did not run at all ("" when they ran)

    def add(self, res: SweepResult) -> None:
        self.ran += len(res.ran)
        self.skipped += len(res.skipped)
        self.unrun += res.unrun
        self.failed += [
            f"{s.run_id} ({s.status}: {s.error})" for s in res.all_failed if not _budget_cut(s)
        ]
        self.budget_cut += [s.run_id for s in res.all_failed if _budget_cut(s)]
        self.damaged += len(res.damaged)

    @property
    def complete(self) -> bool:
        return not (self.unrun or self.budget_cut or self.not_run)


def reproduce(overrides: Sequence[str], progress: bool = True) -> int:
    """Run the reproduction the command line's ``key=value`` describe and write its report; the
    exit status (0 complete, `EXIT_INCOMPLETE` otherwise)."""
    t_start = time.time()
    cfg = load_reproduce_config(overrides)
    claims = find_claims(cfg.claims)
    check_places(cfg)  # every place this writes, checked now, not after minutes of sweeps
    # every run's config (cluster=nosuch), before the first section runs; planned once
    planned = check_sections(cfg)
    done = run_sections(cfg, t_start, progress_mode(progress), planned)
    command = "dcp-bench reproduce " + " ".join(shlex.quote(a) for a in overrides)
    return write_report(cfg, claims, command.strip(), done, t_start)


def check_places(cfg: ReproduceConfig) -> None:
    """``out``, its partial twin, ``root`` and the campaign folder writable, the campaign a name."""
    out_path = Path(cfg.out)
    check_output(out_path, "out")
    check_output(out_path.parent / f"{out_path.name}.partial", "out")
    check_output(cfg.root, "root")
    if not CAMPAIGN_NAME.fullmatch(cfg.campaign):
        raise ConfigError(
            f"campaign={cfg.campaign!r}: expected one folder name of 1 to 100 characters from "
            "A-Z a-z 0-9 . _ - (starting with a letter or digit)"
        )
    check_output(Path(cfg.root) / cfg.campaign, "campaign", value=cfg.campaign)


Planned = dict[str, tuple[list[RunSpec], list[RunSpec]]]


def check_sections(cfg: ReproduceConfig) -> Planned:
    """Every chosen section's runs, composed and parsed (`plan_section`) by section name; the
    first section that does not compose is a `ConfigError` naming it, before any run starts."""
    planned: Planned = {}
    for section in cfg.chosen_sections():
        if section.real and not cfg.real:
            continue
        try:
            planned[section.name] = plan_section(cfg, section)
        except ConfigError as exc:
            raise ConfigError(f"section {section.name}: {exc}") from None
    return planned


def plan_section(
    cfg: ReproduceConfig, section: ReproduceSection
) -> tuple[list[RunSpec], list[RunSpec]]:
    """The section's (simulated, real) runs: every grid with the section's common overrides, the
    campaign's place, the grid keys set and the first seed; a `ConfigError` if one does not
    compose."""
    repeats = section.repeats_in(cfg)
    sim_specs: list[RunSpec] = []
    real_specs: list[RunSpec] = []
    for grid in section.grids:
        base = [
            *section.common_in(cfg),
            *grid,
            f"run.campaign={cfg.campaign}",
            f"run.root={cfg.root}",
            *cfg.grid_keys(),
            f"seed={cfg.seed_base}",
        ]
        if section.simulate:  # a measured-only section (preset=real) has no twins
            sim_specs += plan_sweep(
                [*base, "run.executor=sim"], repeats=repeats, sweep=section.name
            )
        if section.real:
            real_specs += plan_sweep(
                [*base, "run.executor=torch"], repeats=repeats, sweep=section.name
            )
    return sim_specs, real_specs


def run_sections(
    cfg: ReproduceConfig, t_start: float, progress: str, planned: Planned | None = None
) -> Progress:
    """Every chosen section in order under its budget; what was done, and the report's notes.
    ``planned``: the sections' runs as `check_sections` planned them (planned here otherwise)."""
    hard_deadline = t_start + cfg.budget_s - cfg.report_reserve_s
    env = collect_env()  # once: the same machine for every section's runs
    done = Progress(
        notes=[
            f"reproduce config: `{cfg.path}`; budget {cfg.budget_s:g} s "
            f"({cfg.report_reserve_s:g} s kept for the report)"
        ]
    )
    only = cfg.only_sections
    done.notes += [
        f"section {sec.name}: skipped (sections={','.join(only)})"
        for sec in cfg.sections
        if only and sec.name not in only
    ]
    sections = cfg.chosen_sections()
    for index, section in enumerate(sections):
        name = section.name
        # Each later section keeps a minimum share (reserve_s), so a slow machine still gets a
        # first repeat of every section rather than none of the last ones.
        later = sum(s.reserve_s for s in sections[index + 1 :])
        if section.real and not cfg.real:
            done.notes.append(
                f"section {name}: skipped (real=false): no measured runs, so the simulator's error "
                "is not measured"
            )
            continue
        done.wanted.append(name)
        try:
            sim_specs, real_specs = (
                planned[name] if planned and name in planned else plan_section(cfg, section)
            )
        except ConfigError as exc:
            done.notes.append(f"section {name}: NOT RUN, its configs do not compose: {exc}")
            done.cut.append(name)
            continue
        budget = section.budget_s if section.budget_s is not None else cfg.budget_s
        sec_deadline = min(hard_deadline - later, time.time() + budget)
        tally = run_section(
            cfg, sim_specs, real_specs, sec_deadline, hard_deadline - later, progress, env
        )
        if tally.not_run:
            done.notes.append(f"section {name}: real runs NOT RUN: {tally.not_run}")
        if not tally.complete:
            done.cut.append(name)
        done.notes += section_notes(name, tally)
    return done


def run_section(
    cfg: ReproduceConfig,
    sim_specs: list[RunSpec],
    real_specs: list[RunSpec],
    sec_deadline: float,
    later_deadline: float,
    progress: str,
    env: dict[str, Any],
) -> SectionTally:
    """A section's real runs first and alone (simulated runs in parallel would disturb their
    timings), then its simulated runs (``later_deadline`` bounds them when real runs went
    first: the section's own deadline was theirs)."""
    tally = SectionTally()
    if real_specs:
        try:
            tally.add(
                run_sweep(
                    real_specs,
                    jobs=1,
                    progress=progress,
                    deadline=sec_deadline,
                    retry_failed=cfg.retry_failed,
                    env=env,
                )
            )
        except (DcpBenchError, ImportError) as exc:
            tally.not_run = f"{type(exc).__name__}: {exc}"
    tally.add(
        run_sweep(
            sim_specs,
            jobs=cfg.jobs,
            progress=progress,
            retry_failed=cfg.retry_failed,
            env=env,
            deadline=sec_deadline if not real_specs else later_deadline,
        )
    )
    return tally


def section_notes(name: str, tally: SectionTally) -> list[str]:
    """The section's line (printed too), its cells the budget cut, and its failed runs."""
    msg = (
        f"section {name}: {'complete' if tally.complete else 'CUT'}: {tally.ran} run(s) now, "
        f"{tally.skipped} already complete, {len(tally.failed)} failed, {len(tally.budget_cut)} "
        f"cut by the time budget, {len(tally.unrun)} left out by the time budget"
        + (f", {tally.damaged} damaged record(s) redone" if tally.damaged else "")
    )
    print(msg, flush=True)
    notes = [msg]
    if tally.unrun or tally.budget_cut:
        cells = sorted({_cell_name(u) for u in [*tally.unrun, *tally.budget_cut]})
        notes.append(
            f"section {name}: cells with repeats cut or left out by the budget (raise budget_s to "
            "run them): "
            + ", ".join(f"`{c}`" for c in cells[:30])
            + (" ..." if len(cells) > 30 else "")
        )
    notes += [f"section {name}: failed run {f}" for f in tally.failed[:20]]
    return notes


def write_report(
    cfg: ReproduceConfig, claims: Path, command: str, done: Progress, t_start: float
) -> int:
    """The report of what was done: in ``out`` when every section is complete, beside it
    (``<out>.partial``) otherwise; its verdicts printed; the exit status."""
    notes, cut = done.notes, done.cut
    notes.append(f"sweeps took {time.time() - t_start:.0f} s")
    n_done = len(done.wanted) - len(cut)
    completeness = {
        "complete": not cut,
        "sections_done": n_done,
        "sections_total": len(done.wanted),
        "cut": cut,
    }
    verdict = "complete" if not cut else INCOMPLETE.format(done=n_done, total=len(done.wanted))
    notes.insert(
        0, f"completeness: {verdict}" + (f" (not done in full: {', '.join(cut)})" if cut else "")
    )
    out_path = Path(cfg.out)
    out = (
        out_path if not cut else out_path.parent / f"{out_path.name}.partial"
    )  # a complete report stays
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.parent / f".{out.name}.partial-{os.getpid()}"
    shutil.rmtree(tmp, ignore_errors=True)
    try:
        inputs = ReportInputs(
            root=cfg.root,
            campaign=cfg.campaign,
            out_dir=str(tmp),
            claims_path=str(claims),
            command=command,
            notes=notes,
            completeness=completeness,
            title=cfg.title,
        )
        summary = _report_within(inputs, t_start + cfg.budget_s - time.time())
        if summary is None:
            print(
                "verdict: incomplete: the report was not finished within the time budget "
                f"({cfg.budget_s:g} s); nothing written to {out}; rerun `make reproduce` to "
                "resume (runs are kept)"
            )
            return EXIT_INCOMPLETE
        _place_report(summary, tmp, out, completeness)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    print_verdicts(summary, bool(cut))
    print(
        f"report: {summary['report']['md']} ({time.time() - t_start:.0f} s in all, budget "
        f"{cfg.budget_s:g} s)"
    )
    if cut:
        print(
            f"verdict: {verdict} (not done in full: {', '.join(cut)}); the report is in {out}, "
            f"{out_path} is left as it was"
        )
        return EXIT_INCOMPLETE
    print("verdict: complete: every section ran in full")
    return 0


def _place_report(
    summary: dict[str, Any], tmp: Path, out: Path, completeness: dict[str, Any]
) -> None:
    """Name the report's files where they will live (not in the temporary folder; in
    summary.json as the report shows paths, never an absolute local one), then publish."""
    final = {k: out / Path(v).relative_to(tmp) for k, v in summary.get("report", {}).items()}
    summary["report"] = {k: str(v) for k, v in final.items()}
    summary["completeness"] = completeness
    if (tmp / "summary.json").exists():
        shown = {k: shown_path(v) for k, v in final.items()}
        atomic_write_json(
            tmp / "summary.json",
            json.loads((tmp / "summary.json").read_text())
            | {"report": shown, "completeness": completeness},
        )
    _publish(tmp, out)


def print_verdicts(summary: dict[str, Any], incomplete: bool) -> None:
    """One line per claim, and the simulator's error when measured."""
    for c in summary["claims"]:
        val = c["reproduced_value"]
        ci = c["ci95"]
        ci_txt = "-" if ci[0] is None else f"[{ci[0]:.2f}, {ci[1]:.2f}]"
        word = (
            c["verdict"].upper()
            if not incomplete
            else f"INCOMPLETE (on the runs done: {c['verdict']})"
        )
        print(
            f"{c['id']}: {word} - claimed {c['claimed']}x, reproduced "
            f"{'-' if val is None else f'{val:.2f}x'}, 95% CI {ci_txt}"
        )
    err = summary["simulator_error"]
    if err.get("median_abs_step_time_error") is not None:
        print(
            "simulator error on CPU (median |error| of median step time): "
            f"{err['median_abs_step_time_error']:.1%}"
        )


def _publish(tmp: Path, out: Path) -> None:
    """Replace ``out`` with the complete report in ``tmp`` (renames within one folder)."""
    old = out.parent / f".{out.name}.old-{os.getpid()}"
    if out.exists():
        os.replace(out, old)
    os.replace(tmp, out)
    if old.exists():
        shutil.rmtree(old)


def _cell_name(run_id: str) -> str:
    return run_id.rsplit("__s", 1)[0]


def _budget_cut(summary: RunSummary) -> bool:
    """A run the time budget cut (the harness ran out of time; the method did not fail)."""
    return summary.cut_by_budget


def _report_within(inputs: ReportInputs, seconds: float) -> dict[str, Any] | None:
    """`build_report` in a child process stopped after ``seconds`` (the budget bounds the
    report too): its summary, or None when it was stopped. A report that fails raises
    `RuntimeError` with its error line."""
    if seconds <= 0:
        return None
    with tempfile.TemporaryDirectory(prefix="dcp-bench-report-") as side:
        result = Path(side) / "summary.json"

        def child() -> None:
            try:
                summary = build_report(inputs)
                result.write_text(json.dumps({"summary": summary}, default=str))
            except BaseException as exc:
                own = isinstance(exc, DcpBenchError)  # bad input: its own one line, exit status 2
                line = (
                    str(exc) if own else f"{type(exc).__name__}: {exc}"
                ).strip().splitlines() or ["?"]
                result.write_text(json.dumps({"error": line[0], "input": own}))
                raise SystemExit(1) from None

        proc = mp.get_context("fork").Process(target=child)
        proc.start()
        stopped = False
        try:
            proc.join(seconds)
        finally:
            if proc.is_alive():
                stopped = True
                proc.kill()
                proc.join()
        if stopped:
            return None
        if not result.exists():
            raise RuntimeError(
                f"the report process ended with exit code {proc.exitcode} before writing the report"
            )
        data = json.loads(result.read_text())
        if "error" in data:
            if data.get("input"):
                raise DcpBenchError(data["error"])
            raise RuntimeError(f"the report failed: {data['error']}")
        return dict(data["summary"])
