"""What a workload config says about its data (description, source, licence) and the SHA-256 of
the data file reach the workload, every run record, and the `workloads show` output."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest

from dcp_bench.config import load_config, to_container
from dcp_bench.errors import WorkloadError
from dcp_bench.paths import REPO_ROOT
from dcp_bench.run.simulated import run_simulated
from dcp_bench.run.spec import parse_run_spec
from dcp_bench.workloads import load_workload, make_workload


def lengths_file(folder: Path) -> Path:
    path = folder / "lengths.txt"
    path.write_text("\n".join(str(n) for n in (512, 1024, 2048, 4096, 300, 7000)) + "\n")
    return path


def test_config_keys_describe_the_data(tmp_path: Path) -> None:
    path = lengths_file(tmp_path)
    w = load_workload(
        "lengths_file",
        lengths_file=str(path),
        description="code review threads",
        source="our tracker export, 2024",
        licence="CC-BY-4.0",
    )
    assert w.description == "code review threads"
    assert w.provenance["source"] == "our tracker export, 2024"
    assert w.provenance["licence"] == "CC-BY-4.0"
    assert w.provenance["data_file"] == str(path)
    assert w.provenance["data_sha256"] == hashlib.sha256(path.read_bytes()).hexdigest()


def test_without_them_the_file_is_the_source_and_the_licence_is_not_stated(tmp_path: Path) -> None:
    path = lengths_file(tmp_path)
    w = load_workload("lengths_file", lengths_file=str(path))
    assert w.provenance["source"] == str(path)
    assert w.provenance["licence"].startswith("not stated")


@pytest.mark.parametrize(
    ("name", "file"), [("sharegpt", "sharegpt_lengths.json"), ("prolong", "prolong_histogram.json")]
)
def test_packaged_workloads_name_their_data_file_and_hash(name: str, file: str) -> None:
    w = load_workload(name)
    assert (
        w.provenance["data_file"] == f"workloads/data/{file}"
    )  # relative: records hold no local folder
    assert (
        w.provenance["data_sha256"]
        == hashlib.sha256((REPO_ROOT / "workloads" / "data" / file).read_bytes()).hexdigest()
    )


def test_unknown_key_names_the_valid_ones() -> None:
    with pytest.raises(
        WorkloadError,
        match=r"unknown parameter\(s\) license; valid: .*description, source, licence",
    ):
        load_workload("sharegpt", license="MIT")


def test_packaged_example_lists_every_key_so_plain_overrides_work(tmp_path: Path) -> None:
    path = lengths_file(tmp_path)
    cfg = to_container(
        load_config(
            [
                "workload=lengths_file",
                f"workload.lengths_file={path}",
                "workload.length_scale=4",
                "workload.licence=MIT",
                "workload.samples_per_step=3",
                "workload.max_len=5000",
            ]
        )
    )
    w = make_workload(cfg["workload"], seed=1)
    assert (w.length_scale, w.samples_per_step, w.max_len, w.provenance["licence"]) == (
        4.0,
        3,
        5000,
        "MIT",
    )


class _OwnWorkload:
    """A user's workload class with a provenance of its own (what `make_workload` merges into)."""

    def __init__(self, seed: int = 0, n: int = 4) -> None:
        self.seed, self.n = seed, n
        self.provenance: dict[str, str] = {"generator": "test"}

    def global_batch(self, step: int, world_size: int, max_seq_len: int | None = None) -> object:
        raise NotImplementedError


def test_user_target_gets_the_keys_in_its_provenance_not_its_constructor() -> None:
    w = make_workload(
        {
            "_target_": f"{__name__}._OwnWorkload",
            "n": 2,
            "source": "synthetic",
            "licence": "MIT",
            "description": "mine",
        },
        seed=3,
    )
    assert (w.seed, w.n) == (3, 2)
    assert w.provenance == {"generator": "test", "source": "synthetic", "licence": "MIT"}


def test_run_record_keeps_description_licence_and_sha256(tmp_path: Path) -> None:
    path = lengths_file(tmp_path)
    cfg = to_container(
        load_config(
            [
                "workload=lengths_file",
                f"workload.lengths_file={path}",
                "workload.licence=CC0-1.0",
                "workload.description=six lengths",
                "method=bucket_static",
                "cluster=h200x8",
                "model=llama3_8b",
                "steps=1",
                "warmup_steps=0",
                f"root={tmp_path / 'runs'}",
                "campaign=prov",
            ]
        )
    )
    summary = run_simulated(parse_run_spec(cfg), env={})
    assert summary.status == "ok", summary.error
    recorded = json.loads((tmp_path / "runs" / "prov" / summary.run_id / "run.json").read_text())[
        "context"
    ]["workload"]
    assert recorded["description"] == "six lengths"
    assert recorded["provenance"]["licence"] == "CC0-1.0"
    assert recorded["provenance"]["data_sha256"] == hashlib.sha256(path.read_bytes()).hexdigest()
