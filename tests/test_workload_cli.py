"""`dcp-bench workloads`: list, show (text, --json, --plot), batch, and one-line errors."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from dcp_bench.cli import main
from dcp_bench.paths import CONF_DIR
from dcp_bench.workloads import WORKLOADS, load_workload

STAT_KEYS = ["n", "mean", "p10", "p25", "p50", "p75", "p90", "p99", "max"] + [
    f"{a}_share_gt_{k}k" for a in ("token", "attn") for k in (8, 32, 128)
]


def _run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    rc = main(list(argv))
    out = capsys.readouterr()
    return rc, out.out, out.err


def test_list_names_every_workload(capsys: pytest.CaptureFixture[str]) -> None:
    rc, out, _ = _run(capsys, "workloads", "list")
    assert rc == 0
    # the named workloads and the configs that build their own class (FlexSP's iterations)
    expected = sorted(p.stem for p in (CONF_DIR / "workload").glob("*.yaml"))
    assert set(WORKLOADS) <= set(expected)
    assert [line.split()[0] for line in out.splitlines()] == expected
    rc, out, _ = _run(capsys, "workloads", "list", "--json")
    assert [r["name"] for r in json.loads(out)] == expected


def test_show_json_equals_the_workload_stats(capsys: pytest.CaptureFixture[str]) -> None:
    rc, out, _ = _run(capsys, "workloads", "show", "debian_docs", "--json")
    assert rc == 0
    stats = json.loads(out)
    assert set(STAT_KEYS) <= set(stats)
    assert stats == json.loads(json.dumps(load_workload("debian_docs").stats()))


def test_show_text_lists_the_keys(capsys: pytest.CaptureFixture[str]) -> None:
    rc, out, _ = _run(capsys, "workloads", "show", "videosys_zipf")
    assert rc == 0
    shown = {line.split()[0] for line in out.splitlines()[2:] if line.startswith("  ")}
    assert set(STAT_KEYS) <= shown


def test_show_a_users_lengths_file(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    lengths = [100, 200, 9000, 40_000, 150_000]
    f = tmp_path / "mine.txt"
    f.write_text("\n".join(map(str, lengths)))
    rc, out, _ = _run(
        capsys, "workloads", "show", "lengths_file", f"workload.lengths_file={f}", "--json"
    )
    assert rc == 0
    stats = json.loads(out)
    v = np.asarray(lengths, dtype=float)
    assert stats["n"] == 5 and stats["mean"] == pytest.approx(v.mean())
    assert stats["p50"] == pytest.approx(np.percentile(v, 50))
    assert stats["token_share_gt_32k"] == pytest.approx(190_000 / v.sum())
    assert stats["attn_share_gt_128k"] == pytest.approx(150_000**2 / (v**2).sum())


def test_show_writes_a_plot(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    png = tmp_path / "fig" / "prolong.png"
    rc, _, _ = _run(capsys, "workloads", "show", "prolong", "--plot", str(png))
    assert rc == 0
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


# A user's config may name the registry in the spelling before the workloads package, too.
@pytest.mark.parametrize(
    "target", ["dcp_bench.workloads.load_workload", "dcp_bench.workload.load_workload"]
)
def test_list_and_show_reach_a_users_config_folder(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], target: str
) -> None:
    (tmp_path / "workload").mkdir()
    (tmp_path / "workload" / "my_corpus.yaml").write_text(
        f"_target_: {target}\nname: synthetic_fixed\nlength: 777\n"
    )
    rc, out, _ = _run(capsys, "workloads", "list", f"extra_conf={tmp_path}")
    assert rc == 0 and "my_corpus" in [line.split()[0] for line in out.splitlines()]
    rc, out, _ = _run(capsys, "workloads", "show", "my_corpus", f"extra_conf={tmp_path}", "--json")
    assert rc == 0 and json.loads(out)["p50"] == 777


def test_batch_prints_the_global_batch(capsys: pytest.CaptureFixture[str]) -> None:
    rc, out, _ = _run(
        capsys,
        "workloads",
        "batch",
        "sharegpt",
        "workload.length_scale=8",
        "--step",
        "3",
        "--world-size",
        "4",
    )
    assert rc == 0
    data = json.loads(out)
    ref = load_workload("sharegpt", length_scale=8).global_batch(3, 4)
    assert data["sample_ids"] == ref.sample_ids.tolist() and data["tokens"] == ref.tokens.tolist()


@pytest.mark.parametrize(
    ("argv", "needle"),
    [
        (["workloads", "show", "imagenet"], "unknown workload 'imagenet'"),
        (["workloads", "show", "lengths_file"], "lengths_file=PATH"),
        (
            ["workloads", "show", "lengths_file", "workload.lengths_file=/nonexistent/l.txt"],
            "/nonexistent/l.txt",
        ),
        (["workloads", "show", "prolong", "length_scale"], "expected key=value"),
        (["workloads", "show", "prolong", "+workload.flavour=1"], "unknown parameter(s) flavour"),
        (["workloads", "show", "prolong", "flavour=1"], "spelled workload.flavour=1"),
        (
            ["workloads", "show", "prolong", "workload.flavour=1"],
            "with a leading '+': +workload.flavour",
        ),
        (
            ["workloads", "show", "lengths_file", "lengths_file=x.txt"],
            "spelled workload.lengths_file",
        ),
    ],
)
def test_errors_are_one_line_with_status_2(
    capsys: pytest.CaptureFixture[str], argv: list[str], needle: str
) -> None:
    rc, _, err = _run(capsys, *argv)
    assert rc == 2
    assert needle in err and len(err.strip().splitlines()) == 1


def test_bad_lengths_value_names_file_and_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    f = tmp_path / "l.txt"
    f.write_text("12\n0\n")
    rc, _, err = _run(capsys, "workloads", "show", "lengths_file", f"workload.lengths_file={f}")
    assert rc == 2 and f"{f}: line 2: length 0 is not positive" in err
