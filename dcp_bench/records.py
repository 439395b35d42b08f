"""Run records: the results store every command writes to.

Layout: ``<root>/<campaign>/<run_id>/`` holding

- ``config.yaml``  the resolved config of the run,
- ``env.json``     the system description (`dcp_bench.envinfo.collect_env`),
- ``steps.jsonl``  one JSON object per step (`StepRecord`),
- ``run.json``     the summary (`RunSummary`) with a ``status``; written last, so a folder without
  it is an incomplete run;
- ``.owner``       the token of the one writer that owns the folder (see below);
- ``.lock``        held (flock) by the one process executing the run (`try_lock_run`);
- ``.previous/``   while a re-run is under way: the complete record it replaces (see below).

Every file is written atomically (temporary file in the same folder, fsync, rename), so a run killed
at any instant leaves each file either at its previous complete version or at its new one: every
completed step stays readable and no JSON is ever half-written. Under torchrun only rank 0 writes.

Ownership: a folder has one writer at a time. `RunWriter` claims the folder (or is handed a claim
its launcher made, `claim_run`) and checks, under a lock on ``.owner``, that it still holds the
claim before every write. Whoever records a run's end from outside (a launcher that killed it at
its time limit, a sweep that resumes it) takes the folder over first (`take_over`), so a process
that outlives its launcher can never rewrite a final record.

Execution: one process at a time executes a run id, across processes (two sweeps on one
campaign, a sweep and a ``simulate --record``): it holds the run folder's ``.lock`` (flock) from
before it starts the run until the run's record is final; another process finds it held and
waits, or moves on and checks the record again once the lock is free.

Re-runs: a run started over a complete record first links that record's files into
``.previous/`` (renamed into place atomically), and removes it only after the new ``run.json``
is written. A re-run killed at any instant leaves the new complete record or the old one: a folder
without ``run.json`` whose ``.previous/`` holds a complete record is restored from it
(`restore_previous`, done by `check_run` when no process holds the run's lock).

Completeness (`check_run`): a run is complete when ``run.json`` exists, every file of the record
parses, and the record agrees with itself (run id = folder name, measured step count = the lines
of ``steps.jsonl``) and, when asked, with the run it should hold (config hash, seed). A folder
without ``run.json`` is incomplete; one whose record is unreadable or inconsistent is damaged, and
a resumed sweep redoes both.
"""

from __future__ import annotations

import contextlib
import dataclasses
import fcntl
import json
import os
import shutil
import typing
import uuid
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import yaml

from dcp_bench.errors import DcpBenchError
from dcp_bench.files import (
    FILE_MODE,
    atomic_write_json,
    atomic_write_text,
    json_default,
)
from dcp_bench.summary_schema import (
    STEP_SCHEMA_VERSION,
    SUMMARY_SCHEMA_VERSION,
    CostDescription,
    EpochAccounting,
    PlanningCost,
    Predictions,
    RunContext,
    RunOutcome,
    TrainingCurves,
    decode_record,
    hint_text,
    type_ok,
    upgrade_summary,
)

SCHEMA_VERSION = SUMMARY_SCHEMA_VERSION  # of run.json; steps.jsonl: STEP_SCHEMA_VERSION
STATUSES = ("ok", "oom", "timeout", "nonfinite", "error")
Status = Literal["ok", "oom", "timeout", "nonfinite", "error"]
OWNER_FILE = ".owner"
LOCK_FILE = ".lock"
PREVIOUS_DIR = ".previous"
RECORD_FILES = ("config.yaml", "env.json", "steps.jsonl", "run.json")  # run.json last


class RecordError(DcpBenchError, ValueError):
    """A run record that cannot be read: the message names the file (and line) and what is wrong."""

    def __init__(self, path: str | os.PathLike[str], problem: str) -> None:
        super().__init__(f"{path}: {problem}")
        self.path = str(path)
        self.problem = problem


class RunOwnershipLost(RuntimeError):
    """A writer whose run folder was taken over (its launcher recorded the run's end, or another
    sweep started the run again): it must not write."""


def is_writer_rank() -> bool:
    """True on the process that owns the output folder: rank 0 under torchrun, else always."""
    return int(os.environ.get("RANK", "0")) == 0


@dataclass
class StepRecord:
    """One optimizer step, from either executor (simulator or torch)."""

    step: int
    step_time_s: float | None
    warmup: bool = False
    planner_ms: float = 0.0
    tokens: int = 0
    samples: int = 0
    samples_dropped: int = 0  # by the planner (paper mode) or the batch policy (over max length)
    samples_truncated: int = 0  # cut to the model's maximum length by the batch policy
    lower_bound_s: float | None = None
    imbalance: float | None = None
    comm_share: float | None = None
    mfu: float | None = None
    peak_mem_gib: float | None = None
    peak_mem_per_rank_gib: list[float] | None = None
    busy_s: list[float] | None = None
    idle_s: list[float] | None = None
    oom: bool = False
    loss: float | None = None
    grad_norm: float | None = None
    extra: dict[str, Any] = field(default_factory=dict)
    schema_version: int = STEP_SCHEMA_VERSION

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> StepRecord:
        return cls(**_known_fields(cls, data))


@dataclass
class RunSummary:
    """The summary of one run (``run.json``)."""

    run_id: str
    campaign: str
    status: Status
    executor: str  # "sim" or "torch"
    method: str
    workload: str
    cluster: str
    model: str
    seed: int
    config_hash: str  # hash of the resolved config without the seed: the statistics cell
    n_steps: int = 0
    n_warmup: int = 0
    step_time_s: float | None = None  # medians over non-warm-up steps
    lower_bound_s: float | None = None
    imbalance: float | None = None
    peak_mem_gib: float | None = None
    mfu: float | None = None
    planner_ms: float | None = None
    tokens_per_s: float | None = None
    oom_steps: int = 0
    hardware: str | None = None  # measured runs: the machine; simulated runs: the simulated cluster
    cost_source: str | None = None  # simulated runs: the cost model's provenance
    profile: dict[str, Any] | None = None  # the profile used: path and content hash
    error: str | None = None
    started_at: float | None = None
    finished_at: float | None = None
    world_size: int | None = None  # the run's ranks (None: a version-1 record that wrote none)
    # The typed parts (`dcp_bench.summary_schema`); None where the run has no such part (no
    # epoch unit, no training loss, not measured) or a version-1 record did not write it.
    context: RunContext | None = None
    cost_description: CostDescription | None = None
    outcome: RunOutcome | None = None
    training: TrainingCurves | None = None
    epochs: EpochAccounting | None = None
    planning: PlanningCost | None = None
    predictions: Predictions | None = None
    # The executor's own facts (`dcp_bench.execution.ExecutorInfo.info`: parameter count, memory
    # measure, threads, ...), open by design: each executor says what it has.
    executor_info: dict[str, Any] = field(default_factory=dict)
    # What a launcher noted of a run's end it saw from outside (the signal that stopped it).
    notes: dict[str, Any] = field(default_factory=dict)
    schema_version: int = SUMMARY_SCHEMA_VERSION

    def __post_init__(self) -> None:
        if self.status not in STATUSES:
            raise ValueError(f"status {self.status!r} not one of {STATUSES}")

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> RunSummary:
        """A summary from its ``run.json`` object, of this version or migrated once from an
        earlier one (`dcp_bench.summary_schema.upgrade_summary`)."""
        summary: RunSummary = decode_record(cls, upgrade_summary(data))
        return summary

    def to_dict(self) -> dict[str, Any]:
        """The ``run.json`` object (`from_dict` reads it back equal)."""
        return dataclasses.asdict(self)

    @property
    def cut_by_budget(self) -> bool:
        """A run a sweep's time budget cut short (the harness ran out of time, not the method)."""
        return (
            self.status == "timeout"
            and self.context is not None
            and (self.context.limit == "budget")
        )


def _known_fields(cls: type, data: dict[str, Any]) -> dict[str, Any]:
    version = data.get("schema_version", STEP_SCHEMA_VERSION)
    if isinstance(version, bool) or not isinstance(version, int):
        raise TypeError(f"schema_version {version!r}: expected an integer")
    if version > STEP_SCHEMA_VERSION:
        raise ValueError(
            f"record schema_version {version} is newer than this dcp-bench ({STEP_SCHEMA_VERSION})"
        )
    names = {f.name for f in dataclasses.fields(cls)}
    known = {k: v for k, v in data.items() if k in names}
    _check_types(cls, known)
    return known


def _check_types(cls: type, data: dict[str, Any]) -> None:
    """`TypeError` naming the first field whose value does not fit the record's schema."""
    hints = typing.get_type_hints(cls)
    for key, value in data.items():
        hint = hints.get(key)
        if hint is not None and not type_ok(value, hint):
            shown = repr(value)
            shown = shown if len(shown) <= 60 else shown[:57] + "..."
            raise TypeError(
                f"field {key!r} is {shown} ({type(value).__name__}); expected {hint_text(hint)}"
            )


# ------------------------------------------------------------------------------------------------
# Ownership of a run folder


@contextlib.contextmanager
def _owner_lock(run_dir: Path) -> Iterator[int]:
    """The ``.owner`` file of ``run_dir``, open and exclusively locked (flock) while inside."""
    run_dir.mkdir(parents=True, exist_ok=True)
    fd = os.open(run_dir / OWNER_FILE, os.O_RDWR | os.O_CREAT, FILE_MODE)
    try:
        os.fchmod(fd, FILE_MODE)
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield fd
    finally:
        os.close(fd)  # releases the lock


def _read_token(fd: int) -> str:
    os.lseek(fd, 0, os.SEEK_SET)
    return os.read(fd, 256).decode(errors="replace").strip()


def _write_token(fd: int, token: str) -> None:
    os.lseek(fd, 0, os.SEEK_SET)
    os.ftruncate(fd, 0)
    os.write(fd, token.encode())


def new_token() -> str:
    """A fresh ownership token (unique to one writer)."""
    return uuid.uuid4().hex


def claim_run(run_dir: str | os.PathLike[str], token: str | None = None) -> str:
    """Make ``token`` (a fresh one by default) the owner of ``run_dir``, whoever owned it before:
    what a launcher does before it starts a run, and a new run of the same id does. Returns it."""
    token = token or new_token()
    with _owner_lock(Path(run_dir)) as fd:
        _write_token(fd, token)
    return token


def take_over(run_dir: str | os.PathLike[str]) -> str:
    """Revoke the current writer of ``run_dir`` (its next write raises `RunOwnershipLost`) and
    return the new owner's token: what a launcher does before it records a run's end itself."""
    return claim_run(run_dir)


def run_owner(run_dir: str | os.PathLike[str]) -> str | None:
    """The token that owns ``run_dir`` (None when no writer ever claimed it)."""
    path = Path(run_dir) / OWNER_FILE
    if not path.exists():
        return None
    with _owner_lock(Path(run_dir)) as fd:
        return _read_token(fd) or None


@contextlib.contextmanager
def owning(run_dir: str | os.PathLike[str], token: str) -> Iterator[None]:
    """Hold ``run_dir``'s lock while writing, after checking ``token`` still owns it; a takeover
    waits for a write in progress, and a writer that lost the folder raises `RunOwnershipLost`."""
    with _owner_lock(Path(run_dir)) as fd:
        current = _read_token(fd)
        if current != token:
            raise RunOwnershipLost(
                f"{run_dir}: the run folder was taken over (owner {current or 'none'}, "
                f"this writer {token}); not writing"
            )
        yield


def write_summary(run_dir: str | os.PathLike[str], summary: RunSummary, token: str) -> RunSummary:
    """Write ``run.json`` as the owner ``token`` (raises `RunOwnershipLost` if it is not); the
    record it replaces (``.previous/``, kept while the re-run ran) goes once it is written."""
    with owning(run_dir, token):
        atomic_write_json(Path(run_dir) / "run.json", summary.to_dict())
    shutil.rmtree(Path(run_dir) / PREVIOUS_DIR, ignore_errors=True)
    return summary


# ------------------------------------------------------------------------------------------------
# One executing process per run id


def try_lock_run(
    run_dir: str | os.PathLike[str], wait: bool = False, shared: bool = False
) -> int | None:
    """Take the run's execution lock (``.lock``, flock): the open descriptor, to pass to
    `unlock_run` once the run's record is final, or None when another process holds it (with
    ``wait``: block until it is free). A forked child inherits the descriptor, so the lock
    stays held while a run outlives the process that started it.

    ``shared``: the launchers of one multi-node run (one per node, possibly over a shared
    filesystem) execute the run id together, so each holds the lock shared: they do not exclude
    each other (the rendezvous makes them one run), while a single-node execution or a restore,
    which takes it exclusively, still waits for all of them."""
    run_dir = Path(run_dir)
    run_dir.mkdir(parents=True, exist_ok=True)
    fd = os.open(run_dir / LOCK_FILE, os.O_RDWR | os.O_CREAT, FILE_MODE)
    try:
        mode = fcntl.LOCK_SH if shared else fcntl.LOCK_EX
        fcntl.flock(fd, mode | (0 if wait else fcntl.LOCK_NB))
    except BlockingIOError:
        os.close(fd)
        return None
    except BaseException:
        os.close(fd)
        raise
    return fd


def unlock_run(fd: int | None) -> None:
    """Release a lock `try_lock_run` took (this process's descriptor of it)."""
    if fd is not None:
        os.close(fd)


@contextlib.contextmanager
def executing(
    run_dir: str | os.PathLike[str], say: Any = None, shared: bool = False
) -> Iterator[None]:
    """Hold the run's execution lock while inside, waiting for another process that holds it
    (``say`` gets one line saying so before the wait); ``shared`` as in `try_lock_run` (one
    node's launcher of a multi-node run)."""
    fd = try_lock_run(run_dir, shared=shared)
    if fd is None:
        if say is not None:
            say(f"run {Path(run_dir).name}: another process is running it; waiting for it to end")
        fd = try_lock_run(run_dir, wait=True, shared=shared)
    try:
        yield
    finally:
        unlock_run(fd)


# ------------------------------------------------------------------------------------------------
# Re-runs keep the record they replace until theirs is complete


def _link_or_copy(src: Path, dst: Path) -> None:
    try:
        os.link(src, dst)
    except OSError:
        shutil.copy2(src, dst)


def keep_previous(run_dir: str | os.PathLike[str]) -> None:
    """Before a re-run overwrites a complete record: its files linked into ``.previous/``
    (assembled in a temporary folder, renamed into place), so that record stands until the new
    ``run.json`` is written. Writers replace files by rename, so the links keep the old bytes."""
    run_dir = Path(run_dir)
    if not (run_dir / "run.json").exists() or check_run(run_dir, restore=False).state != "complete":
        return  # nothing complete to keep (an earlier kept record, if any, stays)
    tmp = run_dir / f"{PREVIOUS_DIR}.tmp-{os.getpid()}"
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir()
    for name in RECORD_FILES:
        if (run_dir / name).exists():
            _link_or_copy(run_dir / name, tmp / name)
    shutil.rmtree(run_dir / PREVIOUS_DIR, ignore_errors=True)
    os.replace(tmp, run_dir / PREVIOUS_DIR)


def restore_previous(run_dir: str | os.PathLike[str]) -> bool:
    """A folder without ``run.json`` whose ``.previous/`` holds a complete record (a re-run was
    killed): that record put back, file by file and ``run.json`` last, so a restore killed
    half-way is simply done again. Only when no process holds the run's lock. True if restored."""
    run_dir = Path(run_dir)
    prev = run_dir / PREVIOUS_DIR
    if (run_dir / "run.json").exists() or not (prev / "run.json").exists():
        return False
    try:
        fd = try_lock_run(run_dir)
    except OSError:
        return False  # a folder this user cannot write: read as it is
    if fd is None:
        return False  # the re-run is still under way
    try:
        if (run_dir / "run.json").exists() or check_run(
            prev, restore=False, run_id=run_dir.name
        ).state != "complete":
            return False
        for name in RECORD_FILES:
            target = run_dir / name
            if not (prev / name).exists():
                target.unlink(missing_ok=True)
                continue
            tmp = run_dir / f".{name}.restore-{os.getpid()}"
            tmp.unlink(missing_ok=True)
            _link_or_copy(prev / name, tmp)
            os.replace(tmp, target)
        shutil.rmtree(prev, ignore_errors=True)
        return True
    finally:
        unlock_run(fd)


class RunWriter:
    """Writes one run folder. Steps are kept in memory and the whole ``steps.jsonl`` is rewritten
    atomically on each flush; ``finish`` writes ``run.json`` last.

    ``owner``: the token a launcher claimed the folder with (`claim_run`) and handed to this
    writer; without it the writer claims the folder itself. Every write checks the claim, so a
    writer whose folder was taken over raises `RunOwnershipLost` instead of writing."""

    def __init__(
        self,
        root: str | os.PathLike[str],
        campaign: str,
        run_id: str,
        config: dict[str, Any],
        env: dict[str, Any] | None = None,
        enabled: bool | None = None,
        owner: str | None = None,
    ) -> None:
        self.path = Path(root) / campaign / run_id
        self.enabled = is_writer_rank() if enabled is None else enabled
        self.steps: list[StepRecord] = []
        self.token = owner or ""
        if self.enabled:
            if not owner:
                self.token = claim_run(self.path)
            with owning(self.path, self.token):
                stale = self.path / "run.json"
                if stale.exists():  # a rerun replaces an earlier result, kept until it has its own
                    keep_previous(self.path)
                    stale.unlink()
                atomic_write_text(self.path / "config.yaml", yaml.safe_dump(config, sort_keys=True))
                if env is not None:
                    atomic_write_json(self.path / "env.json", env)
                atomic_write_text(self.path / "steps.jsonl", "")

    def add_step(self, record: StepRecord, flush: bool = True) -> None:
        self.steps.append(record)
        if flush:
            self.flush()

    def flush(self) -> None:
        if not self.enabled:
            return
        lines = "".join(
            json.dumps(dataclasses.asdict(s), default=json_default) + "\n" for s in self.steps
        )
        with owning(self.path, self.token):
            atomic_write_text(self.path / "steps.jsonl", lines)

    def finish(self, summary: RunSummary) -> RunSummary:
        if self.enabled:
            self.flush()
            write_summary(self.path, summary, self.token)
        return summary


# ------------------------------------------------------------------------------------------------
# Reading records


def _read_text(path: Path) -> str:
    try:
        return path.read_text(encoding="utf-8")
    except UnicodeDecodeError as exc:
        raise RecordError(path, f"not UTF-8 text ({exc.reason} at byte {exc.start})") from None
    except OSError as exc:
        raise RecordError(path, f"cannot be read ({exc.strerror or exc})") from None


def read_steps(run_dir: str | os.PathLike[str]) -> list[StepRecord]:
    """The run's step records (none when ``steps.jsonl`` is missing). A line that is not a step
    record raises `RecordError` naming the file and the line."""
    path = Path(run_dir) / "steps.jsonl"
    if not path.exists():
        return []
    out = []
    for lineno, line in enumerate(_read_text(path).splitlines(), 1):
        if not line.strip():
            continue
        try:
            data = json.loads(line)
            if not isinstance(data, dict):
                raise TypeError(f"a JSON {type(data).__name__}, not an object")
            out.append(StepRecord.from_dict(data))
        except (json.JSONDecodeError, TypeError, ValueError) as exc:
            raise RecordError(f"{path}:{lineno}", f"corrupt step record ({exc})") from None
    return out


def read_summary(run_dir: str | os.PathLike[str]) -> RunSummary | None:
    """The run's summary, or None while the run is incomplete (no ``run.json``). A ``run.json``
    that is not a run summary raises `RecordError` naming the file."""
    path = Path(run_dir) / "run.json"
    if not path.exists():
        return None
    try:
        data = json.loads(_read_text(path))
        if not isinstance(data, dict):
            raise TypeError(f"a JSON {type(data).__name__}, not an object")
        return RunSummary.from_dict(data)
    except json.JSONDecodeError as exc:
        raise RecordError(
            path, f"not valid JSON ({exc.msg} at line {exc.lineno} column {exc.colno})"
        ) from None
    except (TypeError, ValueError) as exc:
        raise RecordError(path, f"not a run summary ({exc})") from None


@dataclass(frozen=True)
class RunState:
    """What a run folder holds: ``complete`` (a readable, consistent record), ``incomplete`` (no
    ``run.json``: the run never finished) or ``damaged`` (``problem`` says what is wrong)."""

    state: Literal["complete", "incomplete", "damaged"]
    summary: RunSummary | None = None
    problem: str | None = None

    @property
    def failed(self) -> bool:
        """A complete record of a run that did not finish ``ok``."""
        return self.state == "complete" and self.summary is not None and self.summary.status != "ok"


def check_run(
    run_dir: str | os.PathLike[str],
    config_hash: str | None = None,
    seed: int | None = None,
    restore: bool = True,
    run_id: str | None = None,
) -> RunState:
    """Whether ``run_dir`` holds a complete record (module docstring): every file parses, the
    summary names this folder's run and counts the measured steps ``steps.jsonl`` holds, and,
    when given, its config hash and seed are the ones expected. With ``restore``, the record a
    killed re-run replaced is put back first (`restore_previous`)."""
    run_dir = Path(run_dir)
    if restore:
        restore_previous(run_dir)
    if not (run_dir / "run.json").exists():
        return RunState("incomplete")
    try:
        summary = read_summary(run_dir)
        assert summary is not None
        steps = read_steps(run_dir)
        for name in ("config.yaml", "env.json"):
            path = run_dir / name
            if name == "config.yaml" and not path.exists():
                raise RecordError(path, "missing")
            if path.exists():
                text = _read_text(path)
                try:
                    data = yaml.safe_load(text) if name == "config.yaml" else json.loads(text)
                except (yaml.YAMLError, json.JSONDecodeError) as exc:
                    raise RecordError(
                        path, f"does not parse ({str(exc).splitlines()[0]})"
                    ) from None
                if not isinstance(data, dict):
                    raise RecordError(path, "not a mapping")
    except RecordError as exc:
        return RunState("damaged", None, str(exc))
    measured = sum(1 for s in steps if not s.warmup and s.step_time_s is not None)
    warmup = sum(1 for s in steps if s.warmup)
    checks = [
        (
            summary.run_id == (run_id or run_dir.name),
            f"run.json names run {summary.run_id!r}, not this folder's",
        ),
        (
            summary.n_steps == measured,
            f"run.json counts {summary.n_steps} measured step(s), steps.jsonl holds {measured}",
        ),
        (
            summary.n_warmup == warmup,
            f"run.json counts {summary.n_warmup} warm-up step(s), steps.jsonl holds {warmup}",
        ),
        (
            config_hash is None or summary.config_hash == config_hash,
            f"run.json has config hash {summary.config_hash}, the run's config hashes to "
            f"{config_hash}",
        ),
        (
            seed is None or summary.seed == seed,
            f"run.json has seed {summary.seed}, the run's is {seed}",
        ),
    ]
    for ok, problem in checks:
        if not ok:
            return RunState("damaged", summary, f"{run_dir}: {problem}")
    return RunState("complete", summary)


def is_complete(run_dir: str | os.PathLike[str]) -> bool:
    """A readable, self-consistent record (`check_run`)."""
    return check_run(run_dir).state == "complete"


def iter_run_dirs(root: str | os.PathLike[str], campaign: str | None = None) -> Iterator[Path]:
    root = Path(root)
    campaigns = [root / campaign] if campaign else sorted(p for p in root.glob("*") if p.is_dir())
    for camp in campaigns:
        if not camp.is_dir():
            continue
        for run in sorted(camp.iterdir()):
            if run.is_dir() and (run / "config.yaml").exists():
                yield run


def list_runs(root: str | os.PathLike[str], campaign: str | None = None) -> dict[str, list[str]]:
    """Run ids of a campaign split into ``complete``, ``incomplete`` and ``damaged``
    (`check_run`)."""
    out: dict[str, list[str]] = {"complete": [], "incomplete": [], "damaged": []}
    for run in iter_run_dirs(root, campaign):
        out[check_run(run).state].append(run.name)
    return out


def iter_summaries(
    root: str | os.PathLike[str], campaign: str | None = None
) -> Iterable[RunSummary]:
    for run in iter_run_dirs(root, campaign):
        s = read_summary(run)
        if s is not None:
            yield s
