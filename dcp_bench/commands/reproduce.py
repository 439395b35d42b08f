"""`dcp-bench reproduce` (= `make reproduce`): the claim reproduction on its embedded defaults
(``dcp_bench/conf/reproduce/default.yaml``), then the report in ``reports/reproduce/``.

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
(``<out>.partial/``) so the last complete report stays, and exits with status 4
(`EXIT_INCOMPLETE`); ``summary.json`` carries ``completeness`` either way. The budget bounds the
whole command, the report included: a report not finished when it runs out is stopped, and the
reproduction is incomplete. ``out`` and ``root`` are checked before any run starts; the claims
file is found from any folder (relative paths also against the repository).
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import shutil
import time
from pathlib import Path
from typing import Any

NAME = "reproduce"
HELP = (
    "reproduce the DCP claim: simulated sweeps (all methods, workloads, 8-64 GPUs, repeats, "
    "sensitivity) + a real CPU gloo run, then reports/reproduce/ with summary.json; "
    "`dcp-bench reproduce [budget_s=900] [jobs=2] [repeats=5] [real=false] [sections=a,b] "
    "[retry_failed=true] [config=PATH]`"
)
TOP_KEYS = ("config", "campaign", "root", "out", "claims", "budget_s", "report_reserve_s", "jobs", "repeats", "real",
            "sections", "retry_failed", "seed_base", "preset", "cluster", "nnodes", "rdzv_endpoint")
# Run keys a preset leaves open (e.g. `preset=real cluster=h200x32`): added to every grid when set.
GRID_KEYS = ("cluster", "nnodes", "rdzv_endpoint")
EXIT_INCOMPLETE = 4  # a section was cut or not run: the report is written beside out, not over it
BOOLEANS = {"1": True, "true": True, "yes": True, "on": True, "0": False, "false": False, "no": False, "off": False}


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("overrides", nargs="*", help=f"key=value; keys: {', '.join(TOP_KEYS)} (sections=a,b runs only those)")
    parser.add_argument("--no-progress", action="store_true", help="no progress bars or progress lines")


def _number(key: str, value: str, integer: bool, minimum: float) -> float:
    from dcp_bench.errors import ConfigError

    expected = f"expected {'an integer' if integer else 'a finite number'} >= {minimum:g}"
    try:
        out = float(int(value)) if integer else float(value)
    except ValueError:
        raise ConfigError(f"{key}={value!r}: {expected}") from None
    if not minimum <= out < float("inf"):  # also refuses nan
        raise ConfigError(f"{key}={value!r}: {expected}")
    return out


def load_reproduce_config(overrides: list[str]) -> dict[str, Any]:
    """The reproduce config (``config=PATH`` or the packaged default) with the command line's
    ``key=value`` applied; every bad key or value is a `ConfigError` naming it."""
    import yaml

    from dcp_bench.errors import ConfigError
    from dcp_bench.paths import CONF_DIR

    kv: dict[str, str] = {}
    for ov in overrides:
        key, sep, value = ov.partition("=")
        if not sep or key not in TOP_KEYS:
            raise ConfigError(f"bad reproduce argument {ov!r}: expected key=value with key one of {', '.join(TOP_KEYS)}")
        kv[key] = value
    # preset=NAME: the packaged config dcp_bench/conf/reproduce/NAME.yaml (default: default)
    preset = kv.pop("preset", "default")
    presets = sorted(p.stem for p in (CONF_DIR / "reproduce").glob("*.yaml") if not p.stem.endswith("_claims"))
    if preset not in presets:
        raise ConfigError(f"preset={preset!r}: no such reproduce preset; expected one of {', '.join(presets)}")
    path = Path(kv.pop("config", str(CONF_DIR / "reproduce" / f"{preset}.yaml")))
    if not path.is_file():
        raise ConfigError(f"config={str(path)!r}: reproduce config not found (expected a YAML file)")
    try:
        cfg = yaml.safe_load(path.read_text()) or {}
    except (yaml.YAMLError, UnicodeDecodeError) as exc:
        raise ConfigError(f"config={str(path)!r}: not valid YAML ({str(exc).splitlines()[0]})") from None
    if not isinstance(cfg, dict) or not isinstance(cfg.get("sections", []), list):
        raise ConfigError(f"config={str(path)!r}: expected a mapping with a list of sections")
    cfg["_path"] = str(path)
    for key, value in kv.items():
        if key == "budget_s":
            cfg[key] = _number(key, value, integer=False, minimum=1.0)
        elif key == "report_reserve_s":
            cfg[key] = _number(key, value, integer=False, minimum=0.0)
        elif key in ("jobs", "repeats"):
            cfg[key] = int(_number(key, value, integer=True, minimum=1))
        elif key == "seed_base":
            cfg[key] = int(_number(key, value, integer=True, minimum=0))
        elif key in ("real", "retry_failed"):
            if value.lower() not in BOOLEANS:
                raise ConfigError(f"{key}={value!r}: expected true or false")
            cfg[key] = BOOLEANS[value.lower()]
        elif key == "sections":
            names = [str(sec.get("name")) for sec in cfg.get("sections", []) if isinstance(sec, dict)]
            wanted = [s for s in value.split(",") if s]
            unknown = [s for s in wanted if s not in names]
            if not wanted or unknown:
                raise ConfigError(f"sections={value!r}: unknown section {(unknown or [''])[0]!r}; expected names "
                                  f"from {', '.join(names)} (comma-separated)")
            cfg["only_sections"] = wanted
        elif not value:
            raise ConfigError(f"{key}=: expected a value")
        else:
            cfg[key] = value
    if float(cfg.get("report_reserve_s", 60)) >= float(cfg.get("budget_s", 560)):
        raise ConfigError(f"report_reserve_s={cfg.get('report_reserve_s', 60):g}: expected less than "
                          f"budget_s={cfg.get('budget_s', 560):g} (the time kept for the report out of the whole budget)")
    return cfg


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


def run(args: argparse.Namespace) -> int:
    from dcp_bench.campaign.sweep import plan_sweep, progress_mode, run_sweep
    from dcp_bench.envinfo import collect_env
    from dcp_bench.errors import ConfigError, DcpBenchError
    from dcp_bench.files import atomic_write_json, check_output
    from dcp_bench.report.writer import ReportInputs, shown_path
    from dcp_bench.run.spec import CAMPAIGN_NAME, RunSpec

    t_start = time.time()
    cfg = load_reproduce_config(list(args.overrides))
    claims = _find_claims(str(cfg.get("claims", "results/reference/claims.yaml")))
    out_path = Path(str(cfg.get("out", "reports/reproduce")))
    root, campaign = str(cfg.get("root", "runs")), str(cfg.get("campaign", "reproduce"))
    # every place this writes, checked now, not after minutes of sweeps
    check_output(out_path, "out")
    check_output(out_path.parent / f"{out_path.name}.partial", "out")
    check_output(root, "root")
    if not CAMPAIGN_NAME.fullmatch(campaign):
        raise ConfigError(f"campaign={campaign!r}: expected one folder name of 1 to 100 characters from "
                          "A-Z a-z 0-9 . _ - (starting with a letter or digit)")
    check_output(Path(root) / campaign, "campaign", value=campaign)
    budget = float(cfg.get("budget_s", 560))
    reserve = float(cfg.get("report_reserve_s", 60))
    hard_deadline = t_start + budget - reserve
    jobs = int(cfg.get("jobs", 2))
    progress = progress_mode(not args.no_progress)
    retry_failed = bool(cfg.get("retry_failed", False))
    seed_base = int(cfg.get("seed_base", 0))  # seeds seed_base .. seed_base + repeats - 1, every grid
    env = collect_env()  # once: the same machine for every section's runs
    notes: list[str] = [f"reproduce config: `{cfg['_path']}`; budget {budget:g} s ({reserve:g} s kept for the report)"]
    only = cfg.get("only_sections")
    sections = [sec for sec in cfg.get("sections", []) if not only or sec["name"] in only]
    notes += [f"section {sec['name']}: skipped (sections={','.join(only)})" for sec in cfg.get("sections", [])
              if only and sec["name"] not in only]
    wanted: list[str] = []  # the sections this reproduction set out to run
    cut: list[str] = []  # ... and those of them not done in full
    for index, section in enumerate(sections):
        name = section["name"]
        # Each later section keeps a minimum share (reserve_s), so a slow machine still gets a
        # first repeat of every section rather than none of the last ones.
        later = sum(float(s.get("reserve_s", 20)) for s in sections[index + 1:])
        is_real = bool(section.get("real", False))
        if is_real and not cfg.get("real", True):
            notes.append(f"section {name}: skipped (real=false): no measured runs, so the simulator's error is not measured")
            continue
        wanted.append(name)
        repeats = int(section.get("repeats", cfg.get("repeats", 5)))
        common = list(section.get("common", cfg.get("sim_common", [])))
        sim_specs: list[RunSpec] = []
        real_specs: list[RunSpec] = []
        try:
            for grid in section.get("grids", []):
                base = [*common, *[str(g) for g in grid], f"run.campaign={campaign}", f"run.root={root}",
                        *[f"{k}={cfg[k]}" for k in GRID_KEYS if cfg.get(k) is not None], f"seed={seed_base}"]
                if section.get("simulate", True):  # a measured-only section (preset=real) has no twins
                    sim_specs += plan_sweep([*base, "run.executor=sim"], repeats=repeats, sweep=name)
                if is_real:
                    real_specs += plan_sweep([*base, "run.executor=torch"], repeats=repeats, sweep=name)
        except ConfigError as exc:
            notes.append(f"section {name}: NOT RUN, its configs do not compose: {exc}")
            cut.append(name)
            continue
        sec_deadline = min(hard_deadline - later, time.time() + float(section.get("budget_s", budget)))
        ran = skipped = damaged = 0
        unrun: list[str] = []
        failed: list[str] = []
        budget_cut: list[str] = []
        not_run = False
        if real_specs:
            # Real runs first and alone: simulated runs in parallel would disturb their timings.
            try:
                res = run_sweep(real_specs, jobs=1, progress=progress, deadline=sec_deadline,
                                retry_failed=retry_failed, env=env)
            except (DcpBenchError, ImportError) as exc:
                notes.append(f"section {name}: real runs NOT RUN: {type(exc).__name__}: {exc}")
                res = None
                not_run = True
            if res is not None:
                ran += len(res.ran)
                skipped += len(res.skipped)
                unrun += res.unrun
                failed += [f"{s.run_id} ({s.status}: {s.error})" for s in res.all_failed if not _budget_cut(s)]
                budget_cut += [s.run_id for s in res.all_failed if _budget_cut(s)]
                damaged += len(res.damaged)
        res = run_sweep(sim_specs, jobs=jobs, progress=progress, retry_failed=retry_failed, env=env,
                        deadline=sec_deadline if not real_specs else hard_deadline - later)
        ran += len(res.ran)
        skipped += len(res.skipped)
        unrun += res.unrun
        failed += [f"{s.run_id} ({s.status}: {s.error})" for s in res.all_failed if not _budget_cut(s)]
        budget_cut += [s.run_id for s in res.all_failed if _budget_cut(s)]
        damaged += len(res.damaged)
        complete = not (unrun or budget_cut or not_run)
        if not complete:
            cut.append(name)
        msg = (f"section {name}: {'complete' if complete else 'CUT'}: {ran} run(s) now, {skipped} already complete, "
               f"{len(failed)} failed, {len(budget_cut)} cut by the time budget, {len(unrun)} left out by the time "
               "budget" + (f", {damaged} damaged record(s) redone" if damaged else ""))
        print(msg, flush=True)
        notes.append(msg)
        if unrun or budget_cut:
            cells = sorted({_cell_name(u) for u in [*unrun, *budget_cut]})
            notes.append(f"section {name}: cells with repeats cut or left out by the budget (raise budget_s to run them): "
                         + ", ".join(f"`{c}`" for c in cells[:30]) + (" ..." if len(cells) > 30 else ""))
        for f in failed[:20]:
            notes.append(f"section {name}: failed run {f}")
    elapsed = time.time() - t_start
    notes.append(f"sweeps took {elapsed:.0f} s")
    done = len(wanted) - len(cut)
    completeness = {"complete": not cut, "sections_done": done, "sections_total": len(wanted), "cut": cut}
    verdict = "complete" if not cut else INCOMPLETE.format(done=done, total=len(wanted))
    notes.insert(0, f"completeness: {verdict}" + (f" (not done in full: {', '.join(cut)})" if cut else ""))
    command = "dcp-bench reproduce " + " ".join(shlex.quote(a) for a in args.overrides)
    out = out_path if not cut else out_path.parent / f"{out_path.name}.partial"  # a complete report stays
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.parent / f".{out.name}.partial-{os.getpid()}"
    shutil.rmtree(tmp, ignore_errors=True)
    try:
        inputs = ReportInputs(root=root, campaign=campaign, out_dir=str(tmp), claims_path=str(claims),
                              command=command.strip(), notes=notes, completeness=completeness,
                              title=str(cfg.get("title", "dcp-bench: reproducing the DCP claim")))
        summary = _report_within(inputs, t_start + budget - time.time())
        if summary is None:
            print(f"verdict: incomplete: the report was not finished within the time budget ({budget:g} s); "
                  f"nothing written to {out}; rerun `make reproduce` to resume (runs are kept)")
            return EXIT_INCOMPLETE
        # The summary names the report's files where they will live, not in the temporary folder
        # (summary.json as the report shows paths: never an absolute local one).
        final = {k: out / Path(v).relative_to(tmp) for k, v in summary.get("report", {}).items()}
        summary["report"] = {k: str(v) for k, v in final.items()}
        summary["completeness"] = completeness
        if (tmp / "summary.json").exists():
            shown = {k: shown_path(v) for k, v in final.items()}
            atomic_write_json(tmp / "summary.json", json.loads((tmp / "summary.json").read_text())
                              | {"report": shown, "completeness": completeness})
        _publish(tmp, out)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    for c in summary["claims"]:
        val = c["reproduced_value"]
        ci = c["ci95"]
        ci_txt = "-" if ci[0] is None else f"[{ci[0]:.2f}, {ci[1]:.2f}]"
        word = c["verdict"].upper() if not cut else f"INCOMPLETE (on the runs done: {c['verdict']})"
        print(f"{c['id']}: {word} - claimed {c['claimed']}x, reproduced "
              f"{'-' if val is None else f'{val:.2f}x'}, 95% CI {ci_txt}")
    err = summary["simulator_error"]
    if err.get("median_abs_step_time_error") is not None:
        print(f"simulator error on CPU (median |error| of median step time): {err['median_abs_step_time_error']:.1%}")
    took = time.time() - t_start
    print(f"report: {summary['report']['md']} ({took:.0f} s in all, budget {budget:g} s)")
    if cut:
        print(f"verdict: {verdict} (not done in full: {', '.join(cut)}); the report is in {out}, "
              f"{out_path} is left as it was")
        return EXIT_INCOMPLETE
    print("verdict: complete: every section ran in full")
    return 0


INCOMPLETE = "incomplete: {done} of {total} sections, rerun `make reproduce` to resume"


def _budget_cut(summary: Any) -> bool:
    """A run the time budget cut (the harness ran out of time; the method did not fail)."""
    return bool(summary.status == "timeout" and (summary.extra or {}).get("limit") == "budget")


def _find_claims(given: str) -> Path:
    """The claims file: as given, else (a relative path) in the repository, from any folder."""
    from dcp_bench.errors import ConfigError
    from dcp_bench.paths import REPO_ROOT

    path = Path(given)
    if path.is_file():
        return path
    if not path.is_absolute() and (REPO_ROOT / path).is_file():
        return REPO_ROOT / path
    raise ConfigError(f"claims={given!r}: claims file not found here or in {REPO_ROOT} (expected "
                      "results/reference/claims.yaml or a file like it)")


def _report_within(inputs: Any, seconds: float) -> dict[str, Any] | None:
    """`build_report` in a child process stopped after ``seconds`` (the budget bounds the
    report too): its summary, or None when it was stopped. A report that fails raises
    `RuntimeError` with its error line."""
    import multiprocessing as mp
    import tempfile

    from dcp_bench.errors import DcpBenchError
    from dcp_bench.report.writer import build_report

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
                line = (str(exc) if own else f"{type(exc).__name__}: {exc}").strip().splitlines() or ["?"]
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
            raise RuntimeError(f"the report process ended with exit code {proc.exitcode} before writing the report")
        data = json.loads(result.read_text())
        if "error" in data:
            if data.get("input"):
                raise DcpBenchError(data["error"])
            raise RuntimeError(f"the report failed: {data['error']}")
        return dict(data["summary"])
