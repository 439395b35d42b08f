"""Run records: the results store every command writes to.

Layout: ``<root>/<campaign>/<run_id>/`` holding

- ``config.yaml``  the resolved config of the run,
- ``env.json``     the system description (`dcp_bench.envinfo.collect_env`),
- ``steps.jsonl``  one JSON object per step (`StepRecord`),
- ``run.json``     the summary (`RunSummary`) with a ``status``; written last, so a folder without
  it is an incomplete run.

Every file is written atomically (temporary file in the same folder, fsync, rename), so a run killed
at any instant leaves each file either at its previous complete version or at its new one: every
completed step stays readable and no JSON is ever half-written. Under torchrun only rank 0 writes.
"""

from __future__ import annotations

import dataclasses
import json
import os
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import yaml

from dcp_bench.files import atomic_write_bytes, atomic_write_json, atomic_write_text, json_default

SCHEMA_VERSION = 1
STATUSES = ("ok", "oom", "timeout", "nonfinite", "error")
Status = Literal["ok", "oom", "timeout", "nonfinite", "error"]


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
    schema_version: int = SCHEMA_VERSION

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
    extra: dict[str, Any] = field(default_factory=dict)
    schema_version: int = SCHEMA_VERSION

    def __post_init__(self) -> None:
        if self.status not in STATUSES:
            raise ValueError(f"status {self.status!r} not one of {STATUSES}")

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> RunSummary:
        return cls(**_known_fields(cls, data))


def _known_fields(cls: type, data: dict[str, Any]) -> dict[str, Any]:
    version = data.get("schema_version", SCHEMA_VERSION)
    if version > SCHEMA_VERSION:
        raise ValueError(
            f"record schema_version {version} is newer than this dcp-bench ({SCHEMA_VERSION})"
        )
    names = {f.name for f in dataclasses.fields(cls)}
    return {k: v for k, v in data.items() if k in names}


class RunWriter:
    """Writes one run folder. Steps are kept in memory and the whole ``steps.jsonl`` is rewritten
    atomically on each flush; ``finish`` writes ``run.json`` last."""

    def __init__(
        self,
        root: str | os.PathLike[str],
        campaign: str,
        run_id: str,
        config: dict[str, Any],
        env: dict[str, Any] | None = None,
        enabled: bool | None = None,
    ) -> None:
        self.path = Path(root) / campaign / run_id
        self.enabled = is_writer_rank() if enabled is None else enabled
        self.steps: list[StepRecord] = []
        if self.enabled:
            self.path.mkdir(parents=True, exist_ok=True)
            stale = self.path / "run.json"
            if stale.exists():  # a rerun replaces an earlier result
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
        atomic_write_text(self.path / "steps.jsonl", lines)

    def finish(self, summary: RunSummary) -> RunSummary:
        if self.enabled:
            self.flush()
            atomic_write_json(self.path / "run.json", dataclasses.asdict(summary))
        return summary


def read_steps(run_dir: str | os.PathLike[str]) -> list[StepRecord]:
    path = Path(run_dir) / "steps.jsonl"
    if not path.exists():
        return []
    out = []
    for lineno, line in enumerate(path.read_text().splitlines(), 1):
        if not line.strip():
            continue
        try:
            out.append(StepRecord.from_dict(json.loads(line)))
        except (json.JSONDecodeError, TypeError) as exc:
            raise ValueError(f"{path}:{lineno}: corrupt step record ({exc})") from None
    return out


def read_summary(run_dir: str | os.PathLike[str]) -> RunSummary | None:
    """The run's summary, or None while the run is incomplete."""
    path = Path(run_dir) / "run.json"
    if not path.exists():
        return None
    return RunSummary.from_dict(json.loads(path.read_text()))


def is_complete(run_dir: str | os.PathLike[str]) -> bool:
    return (Path(run_dir) / "run.json").exists()


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
    """Run ids of a campaign split into ``complete`` and ``incomplete``."""
    out: dict[str, list[str]] = {"complete": [], "incomplete": []}
    for run in iter_run_dirs(root, campaign):
        out["complete" if is_complete(run) else "incomplete"].append(run.name)
    return out


# The run fields repeated on every row of a per-step index.
STEP_INDEX_KEYS = ("run_id", "campaign", "status", "executor", "method", "workload", "cluster",
                   "model", "seed", "config_hash")


def build_index(
    root: str | os.PathLike[str],
    campaign: str | None = None,
    out: str | os.PathLike[str] | None = None,
    steps: bool = False,
) -> Any:
    """Gather complete runs into one pandas table (one row per run, or per step with
    ``steps=True``); written atomically as Parquet when ``out`` is given."""
    import pandas as pd

    rows: list[dict[str, Any]] = []
    for run in iter_run_dirs(root, campaign):
        summary = read_summary(run)
        if summary is None:
            continue
        base = dataclasses.asdict(summary)
        base["extra"] = json.dumps(base["extra"], sort_keys=True, default=json_default)
        base["profile"] = json.dumps(base["profile"], sort_keys=True) if base["profile"] else None
        if not steps:
            rows.append(base)
            continue
        ident = {k: base[k] for k in STEP_INDEX_KEYS}
        for rec in read_steps(run):
            rec_d = dataclasses.asdict(rec)
            rec_d["extra"] = json.dumps(rec_d["extra"], sort_keys=True, default=json_default)
            rows.append({**ident, **rec_d})
    table = pd.DataFrame(rows)
    if out is not None:
        import io

        buf = io.BytesIO()
        table.to_parquet(buf, index=False)
        atomic_write_bytes(out, buf.getvalue())
    return table


def iter_summaries(root: str | os.PathLike[str], campaign: str | None = None) -> Iterable[RunSummary]:
    for run in iter_run_dirs(root, campaign):
        s = read_summary(run)
        if s is not None:
            yield s
