"""Every bad input of `tests/bad_inputs.py` through the CLI: exit status 2 and one line on stderr
that names the bad value and what was expected (no traceback), before anything runs."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bad_inputs import BAD_INPUTS, fill, run_one, write_data  # noqa: E402


def test_the_table_is_large_and_varied() -> None:
    assert len(BAD_INPUTS) >= 40
    commands = {args[0] for args, _ in BAD_INPUTS}
    assert {"simulate", "train", "sweep", "reproduce", "report", "plan", "workloads"} <= commands


@pytest.mark.parametrize("args,words", BAD_INPUTS, ids=[f"{a[0]} {a[-1]}" for a, _ in BAD_INPUTS])
def test_bad_input_is_one_line_naming_the_value(
    args: list[str], words: list[str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(
        Path(__file__).resolve().parents[1]
    )  # reproduce reads its claims from the repository
    monkeypatch.delenv("DCP_BENCH_MAX_LOCAL_RANKS", raising=False)
    data = write_data(tmp_path / "data")
    before = sorted(p.name for p in (Path("reports")).glob("*")) if Path("reports").exists() else []
    code, err = run_one(fill(args, data))
    assert code == 2, err
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    assert "Traceback" not in err
    for word in fill(words, data):
        assert word in lines[0], (word, lines[0])
    # Nothing was written by a refused command (reproduce never touches reports/).
    assert (
        sorted(p.name for p in Path("reports").glob("*")) if Path("reports").exists() else []
    ) == before
