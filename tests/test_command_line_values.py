"""Values checked before any work (issue 37): the command line's text (each key once, ASCII
digits, no `_` digit groups), integers with named bounds, and a method's options against its
planner's constructor. The CLI rows are in tests/bad_inputs.py; these check the rules directly,
including what must still be accepted."""

from __future__ import annotations

import pytest

from dcp_bench.cli import check_overrides_text
from dcp_bench.config import group_choices, load_config, to_container
from dcp_bench.errors import ConfigError
from dcp_bench.planners.base import check_planner_options
from dcp_bench.run.spec import MAX_RANKS, MAX_STEPS, parse_run_spec

BASE = ["workload=videosys_zipf", "cluster=h200x8", "model=stdit3_xl2"]


def _spec(*overrides: str):  # type: ignore[no-untyped-def]
    return parse_run_spec(to_container(load_config([*BASE, *overrides])))


@pytest.mark.parametrize("method", group_choices("method"))
def test_every_packaged_method_parses_with_its_own_defaults(method: str) -> None:
    assert _spec(f"method={method}").method.target


@pytest.mark.parametrize(
    "overrides",
    [
        ["steps=2", "warmup_steps=1", "seed=3"],
        ["extra_conf=/a", "extra_conf=/b"],  # folders may be listed twice
        ["method=dcp,bucket_static", "cluster=h200x8,h200x32"],  # a sweep's alternatives
        ["run.campaign=run_a", "workload.lengths_file=data/v1_2.txt"],  # '_' between words
        ["+cost.scales.act_bytes=1.5"],
    ],
)
def test_ordinary_command_lines_pass_the_text_check(overrides: list[str]) -> None:
    check_overrides_text(overrides)


@pytest.mark.parametrize(
    "overrides,words",
    [
        (["steps=2", "steps=3"], ["steps=3", "given twice", "steps=2"]),
        (["steps=2", "run.steps=3"], ["run.steps=3", "given twice"]),
        (["+seed=1", "seed=2"], ["seed=2", "given twice"]),
        (["steps=\u0661\u0660"], ["U+0661", "ASCII digit"]),
        (["steps=1_000"], ["'1_000'", "expected 1000"]),
        (["seed=1,2_000"], ["'2_000'", "expected 2000"]),
    ],
)
def test_the_text_check_refuses_and_says_what_was_expected(
    overrides: list[str], words: list[str]
) -> None:
    with pytest.raises(ConfigError) as caught:
        check_overrides_text(overrides)
    for word in words:
        assert word in str(caught.value)


def test_integer_sizes_are_bounded_at_named_limits() -> None:
    assert _spec("method=dcp", f"steps={MAX_STEPS}", "warmup_steps=0").steps == MAX_STEPS
    with pytest.raises(ConfigError, match=rf"steps\)={MAX_STEPS + 1}: .*at most 100,000"):
        _spec("method=dcp", f"steps={MAX_STEPS + 1}")
    with pytest.raises(ConfigError, match=r"run.nproc .*at most 131,072"):
        _spec("method=dcp", f"nproc={MAX_RANKS * 2}")
    with pytest.raises(ConfigError, match=r"=1000.0: .*decimal number"):
        _spec("method=dcp", "steps=1e3")


def test_method_options_are_checked_against_the_planner_constructor() -> None:
    node = {"name": "bucket_static", "_target_": "baselines.bucket_static.BucketStatic"}
    check_planner_options({**node, "sp": 4, "max_batch_size": 1, "recompute": "full"})
    check_planner_options({**node, "sp": None})
    for options, message in [
        ({"sp": "abc"}, r"method.sp='abc' \(method 'bucket_static'\): expected an integer"),
        ({"sp": 0}, r"method.sp=0 .*expected an integer >= 1 or null"),
        ({"sp": 6}, r"method.sp=6 .*power of two"),
        ({"sp": True}, r"method.sp=True .*integer"),
        ({"max_batch_size": 0}, r"method.max_batch_size=0 .*>= 1$"),
        ({"max_batch_size": None}, r"method.max_batch_size=None .*not null"),
    ]:
        with pytest.raises(ConfigError, match=message):
            check_planner_options({**node, **options})
    faithful = {
        "name": "dcp_inter_pac",
        "_target_": "dcp_bench.planners.dcp_faithful.DCPInterPACPlanner",
    }
    with pytest.raises(ConfigError, match=r"method.tolerance=nan .*finite number"):
        check_planner_options({**faithful, "tolerance": float("nan")})
    with pytest.raises(ConfigError, match=r"method.eject='no' .*true or false"):
        check_planner_options({**faithful, "eject": "no"})
