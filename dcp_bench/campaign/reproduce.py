"""The claim reproduction (`dcp-bench reproduce`, `make reproduce`): the sections of a reproduce
config (`dcp_bench.campaign.reproduce_config`) run as sweeps, then the report.

Time: by default nothing is cut. Every section runs to its end, slower on a slower or busier
machine, and prints a line per finished run and per section with what is left and about how long
it takes (`Estimate`: the runs still to do, priced by this command's own measured wall time per
real and per simulated run). A budget is an option (``budget_s=600``, or a section's own
``budget_s``): then it bounds the command's wall time for real (`WallClock`). Runs stop early
enough for the report's reserve (``report_reserve_s``) and a margin: running runs are ended with
every process they started and recorded as ``timeout`` naming the budget, and the runs a budget
cut or left out are listed in the report, never silently dropped. The report is written within
the budget: when the full report cannot finish in time, a short one (what ran, what was cut, the
command that builds the full report) takes its place.

The report is written to a temporary folder beside ``out`` and replaces ``out`` only once it is
complete, so an interrupted or failed reproduction leaves the previous report whole. Resumable: a
rerun skips complete runs, keeps failed ones (``retry_failed=true`` redoes them) and redoes
damaged ones (delete ``runs/reproduce`` for a fresh start).

Completeness: a section is complete when every run it asked for holds a record and none was cut
or left out by a time budget. When any section is not, the reproduction says so ("incomplete:
N of M sections, rerun `make reproduce` to resume"), writes its report beside ``out``
(``<out>.partial/``) so the last complete report stays, and returns `EXIT_INCOMPLETE`;
``summary.json`` carries ``completeness`` either way. ``out`` and ``root`` are checked before any
run starts; the claims file is found from any folder (relative paths also against the
repository).

CPU calibration: a section with ``calibrate: true`` (the real CPU section) first profiles this
machine for the tiny models its real runs train (`calibrate_here`: a short `dcp-bench profile`,
bounded by ``calibrate_s``) and prices its real and simulated runs with that calibration, so the
simulator's measured error is this machine's. When the calibration cannot be measured, the
section runs on the cluster's committed calibration and the report's first screen says so
(MISMATCH, with the reason).
"""

from __future__ import annotations

import contextlib
import json
import multiprocessing as mp
import os
import shlex
import shutil
import signal
import subprocess
import sys
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
from dcp_bench.campaign.sweep import (
    SweepResult,
    pending,
    plan_sweep,
    run_sweep,
    unique_runs,
)
from dcp_bench.config import load_config, to_container
from dcp_bench.envinfo import collect_env
from dcp_bench.errors import ConfigError, DcpBenchError
from dcp_bench.files import atomic_write_json, check_output
from dcp_bench.paths import CONF_DIR, REPO_ROOT
from dcp_bench.records import RunSummary
from dcp_bench.report.first_screen import CALIBRATION_NOTE
from dcp_bench.report.writer import ReportInputs, build_report, shown_path
from dcp_bench.run.spec import CAMPAIGN_NAME, RunSpec
from dcp_bench.run.torch_run import error_tail, run_session

EXIT_INCOMPLETE = 4  # a section was cut or not run: the report is written beside out, not over it
INCOMPLETE = "incomplete: {done} of {total} sections, rerun `make reproduce` to resume"

# Under a budget, runs stop this long before the report's reserve begins: a run the budget cuts is
# killed up to `BUDGET_KILL_GRACE_S` after its limit, a torchrun tree gets its SIGTERM grace
# before SIGKILL, and its record is written, all slower on a loaded machine.
RUN_MARGIN_MIN_S = 15.0
RUN_MARGIN_MAX_S = 60.0
RUN_MARGIN_FRACTION = 0.05
# The full report is stopped this long before the budget ends; the short report is written in it.
REPORT_MARGIN_S = 5.0


@dataclass(frozen=True)
class WallClock:
    """The command's wall-clock bound: none (``budget_s`` None: every section runs to its end), or
    a budget counted from the command's start that runs and report both keep."""

    start: float
    budget_s: float | None = None
    report_reserve_s: float = 60.0

    @property
    def margin_s(self) -> float:
        """What the runs leave unused before the report's reserve (see `RUN_MARGIN_MIN_S`)."""
        if self.budget_s is None:
            return 0.0
        return min(RUN_MARGIN_MAX_S, max(RUN_MARGIN_MIN_S, RUN_MARGIN_FRACTION * self.budget_s))

    def runs_end(self) -> float | None:
        """When every run must have ended (None: no bound)."""
        if self.budget_s is None:
            return None
        return self.start + self.budget_s - self.report_reserve_s - self.margin_s

    def report_end(self) -> float | None:
        """When the full report must be done (the short one is written after it, in time)."""
        if self.budget_s is None:
            return None
        return self.start + self.budget_s - REPORT_MARGIN_S


def section_deadline(
    clock: WallClock, section: ReproduceSection, later_reserve_s: float, now: float
) -> float | None:
    """When ``section``'s runs must end: the whole budget less what later sections keep, and the
    section's own ``budget_s`` from ``now``; None when neither applies."""
    bounds = []
    runs_end = clock.runs_end()
    if runs_end is not None:
        bounds.append(runs_end - later_reserve_s)
    if section.budget_s is not None:
        bounds.append(now + section.budget_s)
    return min(bounds) if bounds else None


def later_reserves(clock: WallClock, sections: Sequence[ReproduceSection]) -> list[float]:
    """Per section, what the sections after it keep out of its share of the budget (their
    ``reserve_s``, scaled down so that together they take at most half of the runs' time, so a
    small budget still runs the first sections); zeros without a budget."""
    runs_end = clock.runs_end()
    if runs_end is None:
        return [0.0] * len(sections)
    window = max(0.0, runs_end - clock.start)
    total = sum(s.reserve_s for s in sections[1:])
    scale = 1.0 if total <= 0 else min(1.0, 0.5 * window / total)
    return [scale * sum(s.reserve_s for s in sections[i + 1 :]) for i in range(len(sections))]


@dataclass
class Progress:
    """What the reproduction has done so far: the notes its report shows, the sections it set
    out to run and those of them not done in full."""

    notes: list[str] = field(default_factory=list)
    wanted: list[str] = field(default_factory=list)
    cut: list[str] = field(default_factory=list)
    calibration: dict[str, Any] | None = None  # the CPU calibration the real section used


def _minutes(seconds: float) -> str:
    if seconds < 90:
        return f"{seconds:.0f} s"
    if seconds < 5400:
        return f"{seconds / 60:.0f} min"
    return f"{seconds / 3600:.1f} h"


class Estimate:
    """The reproduction's progress on stderr: a line per finished run and per section, each with
    what is left and about how long it takes. The estimate prices the runs still to do of each
    kind (real, simulated) at this command's own measured wall time per run of that kind (a
    parallel sweep's runs share its wall time); a kind not yet timed is named, not guessed."""

    KINDS = ("real", "sim")

    def __init__(self, left: dict[str, int], sections: int, enabled: bool = True) -> None:
        self.left = {k: int(left.get(k, 0)) for k in self.KINDS}
        self.total = sum(self.left.values())
        self.count = 0
        self.timed = {k: 0 for k in self.KINDS}
        self.wall = {k: 0.0 for k in self.KINDS}
        self.sections, self.sections_done = sections, 0
        self.enabled = enabled
        self._kind: str | None = None
        self._since = 0.0
        self._ran_in_sweep = 0

    def begin(self, kind: str, now: float | None = None) -> None:
        """A sweep of ``kind`` starts: its wall time is charged to that kind's runs."""
        self._kind, self._since, self._ran_in_sweep = kind, time.time() if now is None else now, 0

    def end(self, planned: int, now: float | None = None) -> None:
        """The sweep is over: its wall time is charged; of the ``planned`` runs it had to do, the
        ones it did not run (finished elsewhere, left out by a budget) leave the count."""
        if self._kind is None:
            return
        now = time.time() if now is None else now
        if self._ran_in_sweep:
            self.wall[self._kind] += now - self._since
            self.timed[self._kind] += self._ran_in_sweep
        self.left[self._kind] = max(0, self.left[self._kind] - (planned - self._ran_in_sweep))
        self._kind = None

    def rate(self, kind: str, now: float | None = None) -> float | None:
        """Measured wall seconds per run of ``kind`` (the running sweep included); None if none
        has finished yet."""
        wall, n = self.wall[kind], self.timed[kind]
        if self._kind == kind and self._ran_in_sweep:
            wall += (time.time() if now is None else now) - self._since
            n += self._ran_in_sweep
        return wall / n if n else None

    def left_text(self, now: float | None = None) -> str:
        """``left: N runs, about T`` (and the kinds not yet timed)."""
        n = sum(self.left.values())
        if n == 0:
            return "left: no runs"
        seconds, timed, untimed = 0.0, False, []
        for kind in self.KINDS:
            if not self.left[kind]:
                continue
            r = self.rate(kind, now)
            if r is None:
                untimed.append(f"{self.left[kind]} {kind} run(s) not yet timed")
            else:
                seconds, timed = seconds + r * self.left[kind], True
        parts = [f"about {_minutes(seconds)}"] if timed else []
        return f"left: {n} run(s), " + " + ".join(parts + untimed)

    def run_done(self, summary: RunSummary) -> None:
        kind = "real" if summary.executor == "torch" else "sim"
        self.count += 1
        self.left[kind] = max(0, self.left[kind] - 1)
        if self._kind == kind:
            self._ran_in_sweep += 1
        took = (summary.finished_at or 0.0) - (summary.started_at or 0.0)
        self._say(
            f"[{self.count}/{self.total}] {summary.status} {took:.1f} s {kind} {summary.run_id}; "
            + self.left_text()
        )

    def section_done(self, name: str, took_s: float) -> None:
        self.sections_done += 1
        self._say(
            f"section {name} done in {_minutes(took_s)} ({self.sections_done} of "
            f"{self.sections} sections); " + self.left_text()
        )

    def say(self, message: str) -> None:
        self._say(message)

    def _say(self, message: str) -> None:
        if self.enabled:
            sys.stderr.write(f"reproduce: {message}\n")
            sys.stderr.flush()


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


def reproduce(overrides: Sequence[str], progress: bool = True, t_start: float | None = None) -> int:
    """Run the reproduction the command line's ``key=value`` describe and write its report; the
    exit status (0 complete, `EXIT_INCOMPLETE` otherwise). ``t_start``: when the command started
    (a budget counts from it; default now)."""
    t_start = time.time() if t_start is None else t_start
    cfg = load_reproduce_config(overrides)
    clock = WallClock(t_start, cfg.budget_s, cfg.report_reserve_s)
    claims = find_claims(cfg.claims)
    check_places(cfg)  # every place this writes, checked now, not after minutes of sweeps
    # every run's config (cluster=nosuch), before the first section runs; planned once
    runs_end = clock.runs_end()
    if progress:  # composing hundreds of configs takes a minute or more on a loaded machine
        sys.stderr.write(
            f"reproduce: planning {len(cfg.chosen_sections())} section(s): every run's config "
            "composed and checked before the first run\n"
        )
        sys.stderr.flush()
    planned = check_sections(cfg, runs_end)
    estimate = Estimate(runs_to_do(cfg, planned), len(planned), enabled=progress)
    estimate.say(
        (
            "no time budget: every section runs to its end"
            if cfg.budget_s is None or runs_end is None
            else f"time budget {cfg.budget_s:g} s: runs end by {runs_end - t_start:.0f} s "
            f"(the report keeps {cfg.report_reserve_s:g} s, a {clock.margin_s:.0f} s margin)"
        )
        + f"; {estimate.total} run(s) to do in {len(planned)} section(s)"
        + (
            f" ({unplanned} section(s) not planned within the budget)"
            if (unplanned := len(cfg.chosen_sections()) - len(planned) - skipped_real(cfg))
            else ""
        )
    )
    done = run_sections(cfg, clock, planned, estimate)
    command = "dcp-bench reproduce " + " ".join(shlex.quote(a) for a in overrides)
    return write_report(cfg, claims, command.strip(), done, clock)


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
    if any(s.calibrate and s.real for s in cfg.chosen_sections()) and cfg.real:
        check_output(calibration_folder(cfg), "root")


Planned = dict[str, tuple[list[RunSpec], list[RunSpec]]]


def check_sections(cfg: ReproduceConfig, deadline: float | None = None) -> Planned:
    """Every chosen section's runs, composed and parsed (`plan_section`) by section name; the
    first section that does not compose is a `ConfigError` naming it, before any run starts. A
    calibrating section is planned with this machine's calibration (`calibration_folder`).
    ``deadline`` (under a budget; composing hundreds of configs takes minutes on a loaded
    machine): the sections not planned by then are left out of the result."""
    planned: Planned = {}
    for section in cfg.chosen_sections():
        if section.real and not cfg.real or missing_method(section):
            continue
        if deadline is not None and time.time() > deadline:
            break
        try:
            planned[section.name] = plan_section(cfg, section, calibration_profile(cfg, section))
        except ConfigError as exc:
            raise ConfigError(f"section {section.name}: {exc}") from None
    return planned


def missing_method(section: ReproduceSection) -> str | None:
    """The method a ``when_method`` section waits for, when it has no config; None otherwise."""
    name = section.when_method
    if name is None or (CONF_DIR / "method" / f"{name}.yaml").is_file():
        return None
    return name


def calibration_profile(cfg: ReproduceConfig, section: ReproduceSection) -> str | None:
    """The calibration a calibrating real section is planned with (`calibration_folder`); None
    for every other section (the cluster's own)."""
    return str(calibration_folder(cfg)) if section.calibrate and section.real else None


def skipped_real(cfg: ReproduceConfig) -> int:
    """The chosen sections that ``real=false`` skips (and those waiting for a method that has
    no config, `missing_method`)."""
    return sum(1 for s in cfg.chosen_sections() if s.real and not cfg.real or missing_method(s))


def runs_to_do(cfg: ReproduceConfig, planned: Planned) -> dict[str, int]:
    """The runs the reproduction has to do, by kind (``real``, ``sim``): every planned run once
    (sections share runs), less those holding a complete record that a rerun keeps."""
    seen: set[str] = set()
    specs: list[RunSpec] = []
    for sim_specs, real_specs in planned.values():
        for spec in [*real_specs, *sim_specs]:
            if spec.run_id not in seen:
                seen.add(spec.run_id)
                specs.append(spec)
    todo, _ = pending(specs, True, cfg.retry_failed, warn=lambda _msg: None)
    real = sum(1 for s in todo if s.executor == "torch")
    return {"real": real, "sim": len(todo) - real}


def plan_section(
    cfg: ReproduceConfig, section: ReproduceSection, profile: str | None = None
) -> tuple[list[RunSpec], list[RunSpec]]:
    """The section's (simulated, real) runs: every grid with the section's common overrides, the
    campaign's place, the grid keys set and the first seed (and ``cost.profile=profile`` when
    given: the calibration its runs are priced with); a `ConfigError` if one does not compose."""
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
            *([f"cost.profile={profile}"] if profile else []),
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
    cfg: ReproduceConfig,
    clock: WallClock,
    planned: Planned | None = None,
    estimate: Estimate | None = None,
) -> Progress:
    """Every chosen section in order (to its end, or under the budget); what was done, and the
    report's notes. ``planned``: the sections' runs as `check_sections` planned them (planned
    here otherwise)."""
    estimate = estimate or Estimate({}, 0, enabled=False)
    env = collect_env()  # once: the same machine for every section's runs
    budget = (
        "no time budget (every section runs to its end)"
        if cfg.budget_s is None
        else f"budget {cfg.budget_s:g} s ({cfg.report_reserve_s:g} s kept for the report, runs "
        f"end {clock.margin_s:.0f} s before it)"
    )
    done = Progress(notes=[f"reproduce config: `{cfg.path}`; {budget}"])
    only = cfg.only_sections
    done.notes += [
        f"section {sec.name}: skipped (sections={','.join(only)})"
        for sec in cfg.sections
        if only and sec.name not in only
    ]
    sections = cfg.chosen_sections()
    reserves = later_reserves(clock, sections)
    for index, section in enumerate(sections):
        name = section.name
        started = time.time()
        if section.real and not cfg.real:
            done.notes.append(
                f"section {name}: skipped (real=false): no measured runs, so the simulator's error "
                "is not measured"
            )
            continue
        waits_for = missing_method(section)
        if waits_for is not None:
            done.notes.append(
                f"section {name}: not judged: no method {waits_for} (the section runs once "
                f"dcp_bench/conf/method/{waits_for}.yaml exists)"
            )
            estimate.say(done.notes[-1])
            continue
        done.wanted.append(name)
        runs_end = clock.runs_end()
        not_planned = planned is not None and name not in planned
        if not_planned and runs_end is not None and time.time() > runs_end:
            done.notes.append(
                f"section {name}: CUT: not planned or started, left out by the time budget "
                f"(budget_s={cfg.budget_s:g}; raise it, or leave it out for no cut)"
            )
            done.cut.append(name)
            continue
        later_end = None if runs_end is None else runs_end - reserves[index]
        sec_deadline = section_deadline(clock, section, reserves[index], started)
        try:
            sim_specs, real_specs = (
                planned[name]
                if planned and name in planned
                else plan_section(cfg, section, calibration_profile(cfg, section))
            )
            if section.calibrate and real_specs:
                done.calibration = calibrate_section(
                    cfg, section, real_specs, sec_deadline, estimate
                )
                if done.calibration["profile"] is None:  # the cluster's own, committed calibration
                    sim_specs, real_specs = plan_section(cfg, section)
                done.notes.append(done.calibration["note"])
        except ConfigError as exc:
            done.notes.append(f"section {name}: NOT RUN, its configs do not compose: {exc}")
            done.cut.append(name)
            continue
        tally = run_section(cfg, sim_specs, real_specs, sec_deadline, later_end, env, estimate)
        if tally.not_run:
            done.notes.append(f"section {name}: real runs NOT RUN: {tally.not_run}")
        if not tally.complete:
            done.cut.append(name)
        done.notes += section_notes(name, tally)
        estimate.section_done(name, time.time() - started)
    return done


def run_section(
    cfg: ReproduceConfig,
    sim_specs: list[RunSpec],
    real_specs: list[RunSpec],
    sec_deadline: float | None,
    later_deadline: float | None,
    env: dict[str, Any],
    estimate: Estimate,
) -> SectionTally:
    """A section's real runs first and alone (simulated runs in parallel would disturb their
    timings), then its simulated runs (``later_deadline`` bounds them when real runs went
    first: the section's own deadline was theirs)."""
    tally = SectionTally()

    def sweep(specs: list[RunSpec], kind: str, jobs: int, deadline: float | None) -> SweepResult:
        estimate.begin(kind)
        res = run_sweep(
            specs,
            jobs=jobs,
            progress="none",
            deadline=deadline,
            retry_failed=cfg.retry_failed,
            env=env,
            on_run=estimate.run_done,
        )
        # the runs it had to do: those it ran and those a budget left out
        estimate.end(len(res.ran) + len(res.unrun))
        return res

    if real_specs:
        try:
            tally.add(sweep(real_specs, "real", 1, sec_deadline))
        except (DcpBenchError, ImportError) as exc:
            tally.not_run = f"{type(exc).__name__}: {exc}"
    tally.add(sweep(sim_specs, "sim", cfg.jobs, sec_deadline if not real_specs else later_deadline))
    return tally


# The short calibration of a real CPU section (`calibrate_here`): the profiler's grid cut to the
# sizes the section's tiny-model runs train, 3 repetitions after a warm-up (the median of 3 drops
# one repetition a burst of load from other processes slowed; the median of 2 is their mean), and
# no rank baseline run (a resident-memory figure that the step-time check does not read).
# tiny_llama: sharegpt at length_scale 8 trains micro-batches of up to ~1.6K tokens per rank at
# SP 1 (one long sample); the law fitted up to 1,024 predicts a 1,469-token micro-batch within
# 6-10% (thread CPU time, the development machine), and a 2,048 point would triple the model's
# calibration time (37 s -> 107 s at load 4-5), widening the gap in time, and so in load, between
# the calibration and the runs it prices.
# tiny_stdit: videosys_zipf at length_scale 64 trains up to ~500 tokens per rank, 98% of them
# images of 2-56 patches packed by the dozen: frames of up to 64 patches make the packed points
# such images (`profiling.request.sample_shapes`).
# results/calibration/cpu/README.md describes the full grid the committed artifacts measured.
CALIBRATION_GRID = {
    "llama": [
        "profile.tokens=[64,256,1024]",
        "profile.sp=[1,2]",
        "profile.packed_samples=[4,32]",
    ],
    "stdit": [
        "profile.tokens=[64,256,1024]",
        "profile.sp=[1,2]",
        "profile.packed_samples=[4,32]",
        "profile.video_spatial=64",
    ],
}
CALIBRATION_OPTIONS = ["profile.reps=3", "profile.rank_baseline=false"]


def calibration_folder(cfg: ReproduceConfig) -> Path:
    """Where the reproduction keeps this machine's CPU calibration (one ``<model>.json`` per
    model): beside the campaign's run folders, not among them."""
    return Path(cfg.root) / f"{cfg.campaign}.calibration"


def calibrate_section(
    cfg: ReproduceConfig,
    section: ReproduceSection,
    real_specs: list[RunSpec],
    deadline: float | None,
    estimate: Estimate,
) -> dict[str, Any]:
    """This machine's CPU calibration for ``section``'s real runs: measured now when the section
    has runs to do (`calibrate_here`, at most ``calibrate_s`` and within ``deadline``), kept when
    every run is done already. What it returns: ``profile`` (the folder the section's runs are
    priced with; None: the cluster's own, committed calibration), ``measured_here``, ``summary``
    (a few words for the verdict lines) and ``note`` (the report's note, `CALIBRATION_NOTE`)."""
    folder = calibration_folder(cfg)
    models = sorted({s.model.name: s.model.arch for s in real_specs}.items())
    nprocs = sorted({s.world_size for s in real_specs})
    todo, _ = pending(unique_runs(real_specs), True, cfg.retry_failed, warn=lambda _msg: None)
    names = ", ".join(m for m, _ in models)
    ranks = " or ".join(str(n) for n in nprocs)
    have = all((folder / f"{m}.json").is_file() for m, _ in models)
    if not todo and have:
        return _calibration(
            str(folder),
            True,
            f"this machine's, measured by an earlier run of this reproduction "
            f"({names}; `{folder}`)",
        )
    limit = cfg.calibrate_s
    if deadline is not None:
        limit = min(limit, deadline - time.time() - 10.0)  # the real runs need the rest
    if limit >= 10.0:
        estimate.say(
            f"calibrating this CPU for section {section.name}: {names} on {ranks} rank(s), at "
            f"most {limit:.0f} s"
        )
    started = time.time()
    problem = (
        f"no time left in the budget (budget_s={cfg.budget_s:g})"
        if limit < 10.0
        else calibrate_here(models, nprocs, folder, started + limit)
    )
    took = time.time() - started
    if problem is None:
        estimate.say(f"calibrated this CPU in {took:.0f} s: {folder}")
        return _calibration(
            str(folder),
            True,
            f"this machine's, measured by this reproduction before its real "
            f"CPU runs ({names}; {ranks} rank(s); {took:.0f} s{calibration_load(folder, models)}; "
            f"`{folder}`)",
        )
    estimate.say(f"this CPU's calibration could not be measured: {problem}")
    where = committed_calibration(models)
    return _calibration(
        None,
        False,
        f"MISMATCH: this machine's could not be measured ({problem}); the "
        f"simulator's CPU check used the committed calibration {where}, not measured on this "
        "machine by this reproduction, so its error includes any difference between that "
        "machine, or its load then, and this one now",
    )


def calibration_load(folder: Path, models: Sequence[tuple[str, str]]) -> str:
    """The machine's 1-minute load average over the calibration (the lowest and highest its
    artifacts recorded at their start and end), as a clause for the report's note; empty when they
    recorded none. Measured times depend on the load, and the calibration is measured minutes
    before the real runs it is compared with."""
    loads: list[float] = []
    for name, _ in models:
        try:
            cost = json.loads((folder / f"{name}.json").read_text()).get("cost") or {}
        except (OSError, ValueError):
            continue
        loads += [float(v) for v in cost.get("load_avg_1m") or [] if v is not None]
    if not loads:
        return ""
    return f"; 1-minute load average {min(loads):.1f}-{max(loads):.1f}"


def _calibration(profile: str | None, here: bool, what: str) -> dict[str, Any]:
    return {
        "profile": profile,
        "measured_here": here,
        "summary": ("calibration: " + what.split(" (", 1)[0])
        if here
        else "calibration: MISMATCH, the committed one, not this machine's",
        "note": CALIBRATION_NOTE + what,
    }


def committed_calibration(models: Sequence[tuple[str, str]]) -> str:
    """The cpu cluster's committed calibration, with where and when its artifacts say they were
    measured."""
    folder = str(to_container(load_config(["cluster=cpu"]))["cluster"].get("profile"))
    bits = []
    for name, _ in models:
        path = REPO_ROOT / folder / f"{name}.json"
        try:
            art = json.loads(path.read_text())
            hw = art.get("hardware") or {}
            when = time.strftime("%Y-%m-%d", time.gmtime(float(art["cost"]["finished_at"])))
            bits.append(f"{name}: {hw.get('cpu_model')}, {hw.get('cpu_cores')} cores, {when}")
        except (OSError, ValueError, KeyError, TypeError):
            bits.append(f"{name}: unreadable")
    return f"`{folder}` ({'; '.join(bits)})"


def calibrate_here(
    models: Sequence[tuple[str, str]], nprocs: Sequence[int], folder: Path, deadline: float
) -> str | None:
    """Profile every ``(name, arch)`` model with `dcp-bench profile` (`CALIBRATION_GRID`) on
    ``nprocs`` ranks into ``folder``, each profile a process session of its own that is ended
    with everything it started at ``deadline``. None when every artifact is written; else what
    went wrong (``folder`` is left as it was)."""
    staging = folder.parent / f".{folder.name}.new-{os.getpid()}"
    shutil.rmtree(staging, ignore_errors=True)
    staging.mkdir(parents=True)
    try:
        for name, arch in models:
            if arch not in CALIBRATION_GRID:
                return f"no calibration grid for {name} (arch {arch})"
            left = deadline - time.time()
            if left <= 0:
                return f"the calibration's time ran out before {name}"
            cmd = [
                sys.executable,
                "-m",
                "dcp_bench.cli",
                "profile",
                f"model={name}",
                f"nproc=[{','.join(map(str, nprocs))}]",
                *CALIBRATION_GRID[arch],
                *CALIBRATION_OPTIONS,
                f"out={staging / f'{name}.json'}",
            ]
            try:
                code, stderr, survivors = run_session(cmd, dict(os.environ), left)
            except (OSError, subprocess.SubprocessError) as exc:
                return f"{name}: {type(exc).__name__}: {exc}"
            if code is None:
                return f"{name}: not done within the calibration's time; every process ended"
            if code != 0 or survivors:
                return f"{name}: `dcp-bench profile` exited {code}: {error_tail(stderr)}"
        folder.mkdir(parents=True, exist_ok=True)
        for path in staging.iterdir():
            os.replace(path, folder / path.name)
        return None
    finally:
        shutil.rmtree(staging, ignore_errors=True)


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
    cfg: ReproduceConfig, claims: Path, command: str, done: Progress, clock: WallClock
) -> int:
    """The report of what was done: in ``out`` when every section is complete, beside it
    (``<out>.partial``) otherwise; its verdicts printed; the exit status. Under a budget, a full
    report not done by `WallClock.report_end` is stopped and a short one written instead."""
    t_start = clock.start
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
    budget = "" if cfg.budget_s is None else f", budget {cfg.budget_s:g} s"
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
        end = clock.report_end()
        summary = _report_within(inputs, None if end is None else end - time.time())
        if summary is None:
            # the budget ran out before the full report: a short one, now, beside out
            completeness = {**completeness, "complete": False, "report": "short"}
            out = out_path.parent / f"{out_path.name}.partial"
            shutil.rmtree(tmp, ignore_errors=True)
            summary = write_short_report(inputs, tmp, cfg, done)
            _place_report(summary, tmp, out, completeness, done.calibration)
            print(
                f"verdict: incomplete: the full report was not finished within the time budget "
                f"({cfg.budget_s:g} s); a short report is in {out} ({time.time() - t_start:.0f} s "
                f"in all); `dcp-bench report campaign={cfg.campaign} root={cfg.root} "
                f"claims={cfg.claims}` builds the full one (runs are kept)"
            )
            return EXIT_INCOMPLETE
        _place_report(summary, tmp, out, completeness, done.calibration)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    print_verdicts(summary, bool(cut), done.calibration)
    print(f"report: {summary['report']['md']} ({time.time() - t_start:.0f} s in all{budget})")
    if cut:
        print(
            f"verdict: {verdict} (not done in full: {', '.join(cut)}); the report is in {out}, "
            f"{out_path} is left as it was"
        )
        return EXIT_INCOMPLETE
    print("verdict: complete: every section ran in full")
    return 0


def write_short_report(
    inputs: ReportInputs, folder: Path, cfg: ReproduceConfig, done: Progress
) -> dict[str, Any]:
    """The report a budget leaves time for when the full one does not finish: ``report.md`` with
    the reproduction's notes (what ran, what was cut or left out, the calibration) and
    ``summary.json``; no statistics, no figures. Its summary (as `build_report` returns one)."""
    folder.mkdir(parents=True)
    lines = [
        f"# {cfg.title} (short report)",
        "",
        f"The full report was not finished within the time budget ({cfg.budget_s:g} s); this "
        "short one lists what ran and what the budget cut. The runs are kept: "
        f"`dcp-bench report campaign={cfg.campaign} root={cfg.root} claims={cfg.claims}` builds "
        "the full report from them, and rerunning the same command resumes the reproduction.",
        "",
        f"Command: `{inputs.command}`",
        "",
        *[f"- {n}" for n in inputs.notes],
        "",
    ]
    md = folder / "report.md"
    md.write_text("\n".join(lines))
    summary: dict[str, Any] = {
        "campaign": cfg.campaign,
        "command": inputs.command,
        "report_kind": "short: the full report was not finished within the time budget",
        "claims": [],
        "notes": list(inputs.notes),
        "report": {"md": str(md)},
    }
    atomic_write_json(folder / "summary.json", summary)
    return summary


def _place_report(
    summary: dict[str, Any],
    tmp: Path,
    out: Path,
    completeness: dict[str, Any],
    calibration: dict[str, Any] | None = None,
) -> None:
    """Name the report's files where they will live (not in the temporary folder; in
    summary.json as the report shows paths, never an absolute local one), add the completeness
    and the CPU calibration used, then publish."""
    final = {k: out / Path(v).relative_to(tmp) for k, v in summary.get("report", {}).items()}
    summary["report"] = {k: str(v) for k, v in final.items()}
    summary["completeness"] = completeness
    extra: dict[str, Any] = {"completeness": completeness}
    if calibration is not None:
        extra["cpu_calibration"] = {k: v for k, v in calibration.items() if k != "note"}
    if (tmp / "summary.json").exists():
        shown = {k: shown_path(v) for k, v in final.items()}
        atomic_write_json(
            tmp / "summary.json",
            json.loads((tmp / "summary.json").read_text()) | {"report": shown, **extra},
        )
    _publish(tmp, out)


def print_verdicts(
    summary: dict[str, Any], incomplete: bool, calibration: dict[str, Any] | None = None
) -> None:
    """One line per claim, and the simulator's error when measured (with the CPU calibration
    it was priced with)."""
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
        for row in c.get("by_cost_source") or []:
            sp, (lo, hi) = row["speedup"], row["ci95"]
            print(
                f"  under {row['cost_source']}: {str(row['verdict']).upper()} - "
                + (
                    row["note"] or "no number"
                    if sp is None
                    else f"{sp:.2f}x, 95% CI [{lo:.2f}, {hi:.2f}]"
                )
            )
    err = summary["simulator_error"]
    if err.get("median_abs_step_time_error") is not None:
        print(
            "simulator error on CPU (median |error| of median step time): "
            f"{err['median_abs_step_time_error']:.1%}"
            + (f" ({calibration['summary']})" if calibration else "")
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


def _report_within(inputs: ReportInputs, seconds: float | None) -> dict[str, Any] | None:
    """`build_report` in a child process (a process group of its own) stopped with everything it
    started after ``seconds`` (a budget bounds the report too; None: no bound): its summary, or
    None when it was stopped. A report that fails raises `RuntimeError` with its error line."""
    if seconds is not None and seconds <= 0:
        return None
    with tempfile.TemporaryDirectory(prefix="dcp-bench-report-") as side:
        result = Path(side) / "summary.json"

        def child() -> None:
            os.setpgid(0, 0)  # its own group: stopped with whatever it starts (git, ...)
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
                if proc.pid is not None:
                    with contextlib.suppress(ProcessLookupError, PermissionError):
                        os.killpg(proc.pid, signal.SIGKILL)
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
