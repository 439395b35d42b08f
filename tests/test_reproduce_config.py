"""The typed reproduce config: every packaged file loads and means what its YAML says, a bad key
is named with its path and the keys expected there, a wrong type is named with the type
expected, and a key left out gets the dataclass's default (written once, there)."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import pytest
import yaml

from dcp_bench.campaign.reproduce_config import (
    ReproduceConfig,
    ReproduceSection,
    load_reproduce_config,
    read_reproduce_yaml,
)
from dcp_bench.errors import ConfigError
from dcp_bench.paths import CONF_DIR

PRESETS = sorted(
    p for p in (CONF_DIR / "reproduce").glob("*.yaml") if not p.stem.endswith("_claims")
)


def _write(tmp_path: Path, data: dict[str, Any]) -> Path:
    path = tmp_path / "reproduce.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


@pytest.mark.parametrize("path", PRESETS, ids=[p.stem for p in PRESETS])
def test_packaged_configs_load_as_their_yaml_says(path: Path) -> None:
    raw = yaml.safe_load(path.read_text())
    cfg = load_reproduce_config([f"preset={path.stem}"])
    assert cfg.path == str(path)
    for key, value in raw.items():
        if key != "sections":
            got = getattr(cfg, key)
            assert (list(got) if isinstance(got, tuple) else got) == value, key
    assert [s.name for s in cfg.sections] == [s["name"] for s in raw["sections"]]
    for sec, raw_sec in zip(cfg.sections, raw["sections"]):
        assert [list(g) for g in sec.grids] == raw_sec["grids"]
        for key in set(raw_sec) - {"grids"}:
            got = getattr(sec, key)
            assert (list(got) if isinstance(got, tuple) else got) == raw_sec[key], (sec.name, key)


def test_a_key_left_out_gets_the_dataclass_default(tmp_path: Path) -> None:
    path = _write(
        tmp_path, {"campaign": "c", "sections": [{"name": "only", "grids": [["method=dcp"]]}]}
    )
    cfg = read_reproduce_yaml(path)
    defaults = ReproduceConfig()
    for f in dataclasses.fields(ReproduceConfig):
        if f.name not in ("campaign", "sections", "path"):
            assert getattr(cfg, f.name) == getattr(defaults, f.name), f.name
    assert cfg.campaign == "c" and cfg.budget_s is None and cfg.jobs == 2 and cfg.repeats == 5
    (sec,) = cfg.sections
    assert sec == ReproduceSection(name="only", grids=(("method=dcp",),))
    # the section's open keys fall back to the top's
    assert sec.repeats_in(cfg) == 5 and sec.common_in(cfg) == ()
    assert sec.repeats_in(dataclasses.replace(cfg, repeats=7)) == 7
    assert dataclasses.replace(sec, common=("a=1",)).common_in(cfg) == ("a=1",)


def test_an_unknown_key_is_named_with_its_path_and_the_valid_keys(tmp_path: Path) -> None:
    path = _write(tmp_path, {"sections": [{"name": "claim", "repeatz": 3, "grids": []}]})
    with pytest.raises(ConfigError) as err:
        read_reproduce_yaml(path)
    msg = str(err.value)
    assert "sections.claim.repeatz" in msg and "unknown key" in msg
    assert all(
        k in msg
        for k in ("name", "grids", "common", "repeats", "budget_s", "reserve_s", "simulate")
    )
    path = _write(tmp_path, {"budget": 100, "sections": []})
    with pytest.raises(ConfigError, match=r"budget: unknown key; expected one of .*budget_s"):
        read_reproduce_yaml(path)
    # set by the command line only, never by the file
    path = _write(tmp_path, {"only_sections": ["a"], "sections": []})
    with pytest.raises(ConfigError, match="only_sections: unknown key"):
        read_reproduce_yaml(path)


@pytest.mark.parametrize(
    ("data", "where", "expected"),
    [
        ({"budget_s": "fast"}, "budget_s", "a number"),
        ({"jobs": 1.5}, "jobs", "an integer"),
        ({"jobs": True}, "jobs", "an integer"),
        ({"real": "yes"}, "real", "true or false"),
        ({"sim_common": "seed=0"}, "sim_common", "a list"),
        (
            {"sections": [{"name": "s", "grids": [["a=1", 2]]}]},
            "sections.s.grids[0][1]",
            "a string",
        ),
        ({"sections": [{"name": "s", "repeats": "3"}]}, "sections.s.repeats", "an integer or null"),
        ({"sections": [{"title": "no name"}]}, "sections[0].name", "missing"),
    ],
)
def test_a_wrong_type_is_named_with_the_type_expected(
    tmp_path: Path, data: dict[str, Any], where: str, expected: str
) -> None:
    with pytest.raises(ConfigError) as err:
        read_reproduce_yaml(_write(tmp_path, {"sections": [], **data}))
    assert f"{where}:" in str(err.value) and expected in str(err.value)


def test_the_command_line_replaces_top_keys(tmp_path: Path) -> None:
    path = _write(
        tmp_path, {"budget_s": 300, "jobs": 1, "sections": [{"name": "a"}, {"name": "b"}]}
    )
    cfg = load_reproduce_config(
        [f"config={path}", "jobs=3", "seed_base=10", "cluster=h200x8", "nnodes=2", "sections=b"]
    )
    assert (cfg.budget_s, cfg.jobs, cfg.seed_base) == (300.0, 3, 10)
    assert cfg.grid_keys() == ["cluster=h200x8", "nnodes=2"]
    assert [s.name for s in cfg.chosen_sections()] == ["b"]
    # named by the key typed: budget_s, with the reserve it must exceed
    with pytest.raises(ConfigError, match=r"^budget_s=50: expected more than the 60 s kept"):
        load_reproduce_config([f"config={path}", "budget_s=50"])
    with pytest.raises(ConfigError, match="report_reserve_s=400: expected less than budget_s=300"):
        load_reproduce_config([f"config={path}", "report_reserve_s=400"])


def test_every_section_is_planned_before_the_first_run_and_a_bad_one_named(
    tmp_path: Path,
) -> None:
    from dcp_bench.campaign.reproduce import check_sections

    good = [
        "workload=videosys_zipf",
        "method=dcp",
        "cluster=h200x8",
        "model=stdit3_xl2",
        "run.steps=1",
        "run.warmup_steps=0",
    ]
    path = _write(
        tmp_path,
        {
            "root": str(tmp_path / "runs"),
            "repeats": 1,
            "sections": [
                {"name": "fine", "grids": [good]},
                {"name": "broken", "grids": [[*good[:2], "cluster=nosuch", *good[3:]]]},
            ],
        },
    )
    with pytest.raises(ConfigError, match=r"^section broken: unknown cluster 'nosuch'"):
        check_sections(load_reproduce_config([f"config={path}"]))
    planned = check_sections(load_reproduce_config([f"config={path}", "sections=fine"]))
    assert list(planned) == ["fine"]
    sim, real = planned["fine"]
    assert len(sim) == 1 and real == []


def test_the_command_line_cluster_and_claims_are_checked_when_read(tmp_path: Path) -> None:
    from dcp_bench.campaign.reproduce_config import find_claims

    with pytest.raises(ConfigError, match=r"^cluster='nosuch': unknown cluster 'nosuch'"):
        load_reproduce_config(["cluster=nosuch"])
    assert load_reproduce_config(["cluster=h200x8@16"]).grid_keys() == ["cluster=h200x8@16"]
    binary = tmp_path / "claims.yaml"
    binary.write_bytes(b"\x00\xff" * 8)
    with pytest.raises(ConfigError, match=r"not UTF-8 text \(byte 1\)"):
        find_claims(str(binary))
    no_claims = tmp_path / "empty.yaml"
    no_claims.write_text("claims: []\n")
    with pytest.raises(ConfigError, match="no list of claims"):
        find_claims(str(no_claims))
    missing_key = tmp_path / "partial.yaml"
    missing_key.write_text("claims:\n  - id: c1\n    value: 2.0\n")
    with pytest.raises(ConfigError, match=r"claim 'c1' has no 'tolerance'"):
        find_claims(str(missing_key))
    assert find_claims("results/reference/claims.yaml").is_file()
