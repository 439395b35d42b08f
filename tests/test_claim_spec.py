"""Claims as data (docs/claims.md): the DCP claim file loads into the engine's form exactly as the
older inline claims list did, a bad claim file is refused in one line naming the bad key or
value, several claim files each keep their own sections, the engine judges each claim's
sensitivity rows against that claim's own band, and `dcp-bench claims` lists them."""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd
import pytest
import yaml

from dcp_bench.cli import main
from dcp_bench.errors import ConfigError
from dcp_bench.paths import RESULTS_DIR
from dcp_bench.report.claim_spec import load_claim_file, load_claim_set
from dcp_bench.report.claims import (
    ClaimResult,
    PairResult,
    judge_sensitivity,
    load_claims,
    spec_for,
    tolerance_band,
    within_tolerance,
)

DCP = RESULTS_DIR / "claims" / "dcp.yaml"
LIST = RESULTS_DIR / "reference" / "claims.yaml"


def test_the_dcp_claim_file_holds_the_claim() -> None:
    c = load_claim_file(DCP)
    assert (c.id, c.name, c.value, c.tolerance, c.metric) == (
        "dcp_paper_headline",
        "dcp",
        2.88,
        0.15,
        "throughput",
    )
    assert c.setup == {"workload": "videosys_zipf", "cluster": "h200x32", "model": "stdit3_xl2"}
    assert c.baseline == {
        "method": "bucket_static",
        "mode": "paper",
        "params": {"sp": 4, "recompute": "full"},
    }
    assert c.method == {"method": "dcp_inter_pac", "mode": "paper"}
    assert c.source.location == "headline end-to-end result"
    assert c.validation_system == "dcp_blog_h100_zipf"
    # the band by hand: 2.88 / 1.15 = 2.5043..., 2.88 x 1.15 = 3.312
    lo, hi = tolerance_band(c.value, c.tolerance)
    assert lo == pytest.approx(2.504347826) and hi == pytest.approx(3.312)


def test_the_claims_list_and_the_claim_file_give_the_engine_the_same_claims() -> None:
    from_list, from_file = load_claims(LIST), load_claims(DCP)
    assert from_list["claims"] == from_file["claims"]
    for key in ("readings", "comparisons", "paper_table", "sensitivity", "model_band"):
        assert from_list[key] == from_file[key], key
    # every section of the claim file is the claim's own
    assert from_list["sensitivity"]["claim"] == "dcp_paper_headline"
    assert all(rd["claim"] == "dcp_paper_headline" for rd in from_list["readings"])
    assert [s.id for s in from_list["_systems"]] == ["dcp_blog_h100_zipf"]
    assert from_list["statistics"] == {"max_relative_half_width": 0.05}
    assert len(from_list["model_band"]["variants"]) == 13


def _write(tmp: Path, name: str, edit: dict | None = None, drop: str | None = None) -> Path:
    raw = yaml.safe_load(DCP.read_text())
    raw["validation"]["systems"] = str(RESULTS_DIR / "validation" / "systems.yaml")
    raw.update(edit or {})
    if drop:
        raw.pop(drop)
    path = tmp / name
    path.write_text(yaml.safe_dump(raw, sort_keys=False))
    return path


@pytest.mark.parametrize(
    "edit,drop,message",
    [
        ({"tolerence": 0.1}, None, "tolerence: unknown key; expected one of id, statement"),
        ({"tolerance": 1.5}, None, "tolerance: 1.5; expected a number > 0, <= 1"),
        ({"value": "2.88x"}, None, "value: '2.88x'; expected a number > 0"),
        (
            {"decide": {"baseline": {"method": "bucket_static", "mode": "papr"}, "method": {}}},
            None,
            "decide.baseline.mode: 'papr'; expected one of paper, fair",
        ),
        ({"setup": {"workload": "videosys_zipf", "cluster": "h200x32"}}, None, "no 'model'"),
        ({"source": {"publication": "x", "location": "y", "page": 3}}, None, "source.page"),
        ({"metric": "tokens"}, None, "metric: 'tokens'; expected one of throughput, step_time"),
        ({"sensitivity": {"constants": ["act_bytes"], "factor": [2]}}, None, "sensitivity.factor"),
        (
            {
                "validation": {
                    "systems": str(RESULTS_DIR / "validation" / "systems.yaml"),
                    "system": "nope",
                }
            },
            None,
            "validation.system: 'nope' not in",
        ),
        (None, "decide", "no 'decide'; a claim file needs id, statement"),
    ],
)
def test_a_bad_claim_file_is_refused_in_one_line_naming_the_key(
    tmp_path: Path, edit: dict | None, drop: str | None, message: str
) -> None:
    path = _write(tmp_path, "bad.yaml", edit, drop)
    with pytest.raises(ConfigError) as exc:
        load_claim_set(path)
    text = str(exc.value)
    assert message in text and "\n" not in text and str(path) in text, text


def test_a_validating_system_must_name_the_claim(tmp_path: Path) -> None:
    path = _write(tmp_path, "other.yaml", {"id": "other_claim"})
    with pytest.raises(ConfigError, match="validates claim 'dcp_paper_headline'; expected"):
        load_claim_file(path)


def test_several_claim_files_keep_their_own_sections(tmp_path: Path) -> None:
    _write(tmp_path, "a.yaml")
    _write(
        tmp_path,
        "b.yaml",
        {
            "id": "second",
            "name": "second",
            "value": 1.98,
            "model_band": {"variants": [{"mem_cap_fraction": 0.6}]},
            "readings": [],
            "comparisons": [],
        },
        drop="validation",
    )
    listing = tmp_path / "claims.yaml"
    listing.write_text(yaml.safe_dump({"version": 3, "claim_files": ["a.yaml", "b.yaml"]}))
    claims = load_claims(listing)
    assert [c["id"] for c in claims["claims"]] == ["dcp_paper_headline", "second"]
    assert isinstance(claims["model_band"], list) and len(claims["model_band"]) == 2
    assert spec_for(claims, "model_band", "second")["variants"] == [{"mem_cap_fraction": 0.6}]
    assert len(spec_for(claims, "model_band", "dcp_paper_headline")["variants"]) == 13
    assert spec_for(claims, "paper_table", "second")["clusters"] == ["h200x32", "h100x32"]
    assert load_claim_set(listing).by_name("second").value == 1.98
    with pytest.raises(
        ConfigError, match="claim='x': no such claim .* expected one of dcp, second"
    ):
        load_claim_set(listing).by_name("x")
    listing.write_text(yaml.safe_dump({"claim_files": ["a.yaml", "a.yaml"]}))
    with pytest.raises(ConfigError, match="claim id 'dcp_paper_headline' appears twice"):
        load_claim_set(listing)


def _claim(cid: str, value: float, tol: float) -> ClaimResult:
    pr = PairResult("w", "b", "m", 2.0, 1.9, 2.1, 5, "throughput", "bc", "mc")
    return ClaimResult(cid, "", value, tol, pr, "not reproduced")


def test_each_claims_sensitivity_rows_are_judged_against_its_own_band() -> None:
    # claim a's band: [2.88 / 1.15, 2.88 x 1.15] = [2.504, 3.312];
    # claim b's: [1.98 / 1.1, 1.98 x 1.1] = [1.8, 2.178]
    a, b = _claim("a", 2.88, 0.15), _claim("b", 1.98, 0.10)
    sens = pd.DataFrame(
        [
            {"comparison": "a", "constant": "x", "factor": 0.5, "speedup": 2.7,
             "ci_low": 2.6, "ci_high": 2.8},  # inside a's band
            {"comparison": "a", "constant": "x", "factor": 2.0, "speedup": 2.45,
             "ci_low": 2.4, "ci_high": 2.55},  # straddles a's lower edge
            {"comparison": "a", "constant": "y", "factor": 2.0, "speedup": float("nan"),
             "ci_low": float("nan"), "ci_high": float("nan")},  # no number: left out
            {"comparison": "b", "constant": "x", "factor": 0.5, "speedup": 2.7,
             "ci_low": 2.6, "ci_high": 2.8},  # above b's band
        ]
    )  # fmt: skip
    judge_sensitivity([a, b], sens)
    assert [(v["factor"], v["verdict"]) for v in a.sensitivity_verdicts] == [
        (0.5, "reproduced"),
        (2.0, "undecided"),
    ]
    assert [v["verdict"] for v in b.sensitivity_verdicts] == ["not reproduced"]


def test_the_validation_rule_tests_the_error_against_the_tolerance() -> None:
    assert within_tolerance(-0.13, 0.15) and within_tolerance(0.15, 0.15)
    assert not within_tolerance(-0.26, 0.15) and not within_tolerance(0.151, 0.15)


def test_the_claims_command_lists_the_claims(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["claims", "--json"]) == 0
    rows = json.loads(capsys.readouterr().out)
    # the reproduction's list first, then every other claim file in results/claims/
    assert [(r["id"], r["name"], r["claimed"], r["tolerance"]) for r in rows] == [
        ("dcp_paper_headline", "dcp", 2.88, 0.15),
        ("flexsp_vs_megatron_headline", "flexsp", 1.98, 0.15),
        ("flexsp_vs_deepspeed_headline", "flexsp_deepspeed", 1.72, 0.15),
    ]
    assert rows[0]["source"].startswith("DCP paper") and rows[0]["file"].endswith("dcp.yaml")
    assert rows[0]["judged_by"] == "dcp-bench reproduce"
    assert rows[1]["file"] == "results/claims/flexsp.yaml"
    assert rows[1]["judged_by"] == "dcp-bench reproduce claim=flexsp"
    assert rows[2]["judged_by"] == "dcp-bench reproduce claim=flexsp_deepspeed"
    # a list named on the command line is listed alone
    assert main(["claims", "claims=results/reference/claims.yaml", "--json"]) == 0
    assert [r["id"] for r in json.loads(capsys.readouterr().out)] == ["dcp_paper_headline"]
    assert main(["claims"]) == 0
    out = capsys.readouterr().out
    assert "dcp_paper_headline (dcp): claimed 2.88x, tolerance 15% (band [2.50, 3.31])" in out
    assert main(["claims", "claimz=x"]) == 2
    assert "bad claims argument 'claimz=x'" in capsys.readouterr().err
