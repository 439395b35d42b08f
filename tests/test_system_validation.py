"""System-level validation (`dcp_bench.report.system_validation`): published end-to-end figures
against simulated ones, and the verdict rule that abstains when the simulator misses them."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import yaml

from dcp_bench.errors import ConfigError
from dcp_bench.paths import RESULTS_DIR
from dcp_bench.report.claims import load_claims, verdict_rule
from dcp_bench.report.system_validation import (
    load_systems,
    system_for_claim,
    validate_system,
)

SYSTEMS = RESULTS_DIR / "validation" / "systems.yaml"
SHARED = Path(__file__).resolve().parents[2] / "shared" / "data" / "dcp_blog_h100_zipf.json"


def test_the_committed_systems_file_holds_the_authors_published_figures() -> None:
    (dcp,) = [s for s in load_systems(SYSTEMS) if s.id == "dcp_blog_h100_zipf"]
    assert dcp.claim == "dcp_paper_headline" and dcp.context["cluster"] == "h100x32"
    published = {r.id: r.published for r in dcp.rows}
    if SHARED.exists():  # the publication's own numbers, as the data folder records them
        pub = json.loads(SHARED.read_text())["throughput"]
        assert published == {("bucket_static" if k == "baseline" else k): v for k, v in pub.items()}
    assert published == {
        "bucket_static": 0.90,
        "dcp_intra": 1.40,
        "dcp_inter": 1.92,
        "dcp_inter_pac": 2.24,
    }
    ov = dcp.run_overrides(dcp.row("bucket_static"), 3)
    assert "method.sp=4" in ov and "method.mode=paper" in ov and ov[-1] == "seed=3"
    # the claims file names the systems file, so every verdict finds its validation
    claims = load_claims(RESULTS_DIR / "reference" / "claims.yaml")
    assert system_for_claim(claims["_systems"], "dcp_paper_headline") is not None


def test_validation_by_hand() -> None:
    (dcp,) = load_systems(SYSTEMS)
    # seeds 0 and 1: baseline 2.0 and 1.0 M/s, PAC 3.0 and 2.0 M/s (voxels/s before the scale)
    sim = {
        "bucket_static": {0: 2.0e6, 1: 1.0e6},
        "dcp_intra": {0: 2.0e6, 1: 1.0e6},
        "dcp_inter": {0: 3.0e6, 1: 2.0e6},
        "dcp_inter_pac": {0: 3.0e6, 1: 2.0e6},
    }
    v = validate_system(dcp, sim)
    row = {r["id"]: r for r in v.rows}
    assert row["bucket_static"]["simulated"] == pytest.approx(1.5)  # median of 2 and 1
    assert row["bucket_static"]["error"] == pytest.approx(1.5 / 0.90 - 1)
    # speedup: median of the per-seed ratios 1.5 and 2.0
    assert row["dcp_inter_pac"]["simulated_speedup"] == pytest.approx(1.75)
    assert v.claimed_published == pytest.approx(2.24 / 0.90)
    assert v.claimed_error == pytest.approx(1.75 / (2.24 / 0.90) - 1)
    # a row the campaign lacks: no number, and the claimed comparison cannot be judged
    partial = validate_system(dcp, {"bucket_static": sim["bucket_static"]}, note="x")
    assert math.isnan(partial.claimed_error)


def test_the_verdict_stands_only_when_the_simulator_reproduces_the_publication() -> None:
    (dcp,) = load_systems(SYSTEMS)
    base = {0: 1.0e6}

    def with_speedup(x: float):  # type: ignore[no-untyped-def]
        return validate_system(
            dcp,
            {
                "bucket_static": base,
                "dcp_intra": base,
                "dcp_inter": base,
                "dcp_inter_pac": {0: x * 1.0e6},
            },
        )

    far = with_speedup(1.85)  # the simulator 26% below the published 2.49x
    v, why = verdict_rule("not reproduced", 0.15, far)
    assert v == "undecided"
    assert "misses the authors' 32 x NVIDIA H100 measurement of this comparison" in why
    assert "(dcp_inter_pac over bucket_static, videosys_zipf) by 26%" in why
    assert "seed CI alone would say not reproduced" in why
    near = with_speedup(2.40)  # within 4%
    assert verdict_rule("not reproduced", 0.15, near)[0] == "not reproduced"
    assert verdict_rule("reproduced", 0.15, near)[0] == "reproduced"
    assert "within 4%" in verdict_rule("reproduced", 0.15, near)[1]
    # an error exactly at the tolerance still stands; just beyond it abstains
    edge = 2.24 / 0.90 * 1.15
    assert verdict_rule("reproduced", 0.15, with_speedup(edge * 0.999))[0] == "reproduced"
    assert verdict_rule("reproduced", 0.15, with_speedup(edge * 1.01))[0] == "undecided"
    # no validation at all, or validating cells missing: undecided, said why
    assert verdict_rule("reproduced", 0.15, None)[0] == "undecided"
    missing = validate_system(dcp, {}, note="not in this campaign: dcp_inter_pac")
    v, why = verdict_rule("not reproduced", 0.15, missing)
    assert v == "undecided" and "not in this campaign" in why
    # the CI's own abstentions pass through
    assert verdict_rule("no data", 0.15, far) == ("no data", "")
    assert verdict_rule("undecided", 0.15, near) == ("undecided", "")


def test_a_malformed_systems_file_is_refused_by_name(tmp_path: Path) -> None:
    raw = yaml.safe_load(SYSTEMS.read_text())
    bad = dict(raw["systems"][0])
    bad["rows"] = [*bad["rows"][:1], {**bad["rows"][1], "published": -1}]
    p = tmp_path / "s.yaml"
    p.write_text(yaml.safe_dump({"systems": [bad]}))
    with pytest.raises(ConfigError, match="published=-1; expected a number > 0"):
        load_systems(p)
    bad = {
        **raw["systems"][0],
        "claimed_comparison": {"method": "nope", "baseline": "bucket_static"},
    }
    p.write_text(yaml.safe_dump({"systems": [bad]}))
    with pytest.raises(ConfigError, match="no row 'nope'"):
        load_systems(p)
    extra = {**raw["systems"][0], "colour": "red"}
    p.write_text(yaml.safe_dump({"systems": [extra]}))
    with pytest.raises(ConfigError, match="unknown \\['colour'\\]"):
        load_systems(p)


@pytest.mark.slow
def test_the_committed_system_table_is_what_the_simulator_gives_now(tmp_path: Path) -> None:
    """`dcp-bench validate` regenerates results/validation/systems.json: the committed numbers
    are the current simulator's (simulated results do not depend on the host)."""
    from dcp_bench.campaign.system_validation import validate_systems

    validate_systems(out=tmp_path)
    fresh = json.loads((tmp_path / "systems.json").read_text())
    committed = json.loads((RESULTS_DIR / "validation" / "systems.json").read_text())
    assert fresh == committed


def test_the_first_screen_shows_the_validation_beside_the_verdict() -> None:
    from dcp_bench.report.first_screen import validation_line

    (dcp,) = load_systems(SYSTEMS)
    base = {0: 1.0e6}

    def claim_with(x: float, ci: str) -> dict:  # type: ignore[type-arg]
        v = validate_system(
            dcp,
            {
                "bucket_static": base,
                "dcp_intra": base,
                "dcp_inter": base,
                "dcp_inter_pac": {0: x * 1e6},
            },
        )
        verdict, rule = verdict_rule(ci, 0.15, v)
        return {
            "tolerance": 0.15,
            "verdict": verdict,
            "ci_verdict": ci,
            "verdict_rule": rule,
            "validation": v.to_dict(),
        }

    line = validation_line(claim_with(2.17, "not reproduced"))
    assert line is not None
    assert "simulated 2.17x, published 2.49x, error -13%" in line
    assert "within the claim's 15% tolerance, so the simulated verdict stands" in line
    line = validation_line(claim_with(1.31, "not reproduced"))
    assert line is not None and "error -47%" in line
    assert "UNDECIDED in simulation (the seed CI alone: not reproduced)" in line
    assert validation_line({"tolerance": 0.15, "verdict_rule": ""}) is None
