"""Files beside the code that must stay in step with it: the docs' tables and lists (generated or
checked here), the package metadata, and the Makefile's exit status."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import tomllib

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tests"))
from bad_inputs import BAD_INPUTS  # noqa: E402


def _doc_rows(text: str) -> list[tuple[int, str]]:
    """(number, command) of each row of docs/bad_inputs.md's table."""
    rows = []
    for line in text.splitlines():
        m = re.match(r"^\| (\d+) \| `dcp-bench (.*?)` \| ", line)
        if m:
            rows.append((int(m.group(1)), m.group(2).replace("\\|", "|")))
    return rows


def test_bad_inputs_doc_has_one_row_per_test_row_in_order() -> None:
    rows = _doc_rows((REPO / "docs" / "bad_inputs.md").read_text())
    assert [n for n, _ in rows] == list(range(1, len(rows) + 1))
    expected = [" ".join(args) for args, _ in BAD_INPUTS]
    # A row added to tests/bad_inputs.py needs `python tests/bad_inputs.py` rerun into the doc.
    assert len(rows) == len(expected), (len(rows), len(expected))
    for (n, shown), want in zip(rows, expected):
        assert shown == want, (n, shown, want)


def _doc_section_names(text: str) -> list[str]:
    """The section names, in order, of docs/reproduce.md's numbered list of sections."""
    start = text.index("Sections (all simulated")
    names: list[str] = []
    for line in text[start:].splitlines()[1:]:
        m = re.match(r"^\d+\. (.*?):", line)
        if m:
            names += re.findall(r"`([a-z0-9_]+)`", m.group(1))
        elif names and line and not line.startswith(" "):
            break
    return names


def test_reproduce_doc_lists_every_section_of_the_default_config_in_order() -> None:
    from dcp_bench.campaign.reproduce_config import load_reproduce_config

    cfg = load_reproduce_config([])
    documented = _doc_section_names((REPO / "docs" / "reproduce.md").read_text())
    assert documented == [s.name for s in cfg.sections]


def test_license_is_an_spdx_string_without_deprecated_forms() -> None:
    project = tomllib.loads((REPO / "pyproject.toml").read_text())
    meta = project["project"]
    assert meta["license"] == "Apache-2.0"
    assert not any(c.startswith("License ::") for c in meta.get("classifiers", []))
    # setuptools reads a string `license` as SPDX from version 77 (PEP 639)
    requires = project["build-system"]["requires"]
    assert any(
        re.fullmatch(r"setuptools>=(\d+)", r) and int(r.split(">=")[1]) >= 77 for r in requires
    )


@pytest.mark.skipif(shutil.which("make") is None, reason="needs GNU make")
def test_make_reproduce_names_the_cli_status_and_the_script_exits_with_it(tmp_path: Path) -> None:
    venv = tmp_path / "venv"
    (venv / "bin").mkdir(parents=True)
    for name, body in {"dcp-bench": 'echo "ran: $*"\nexit 4\n', "python": "exit 0\n"}.items():
        exe = venv / "bin" / name
        exe.write_text("#!/bin/sh\n" + body)
        exe.chmod(0o755)
    (venv / ".installed").touch()  # newer than pyproject.toml: setup has nothing to do
    env = {**os.environ, "VENV": str(venv)}
    made = subprocess.run(
        ["make", "-s", "-C", str(REPO), "reproduce", f"VENV={venv}", "ARGS=budget_s=5"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert made.returncode == 2  # GNU make's own status for any failing recipe
    assert "ran: reproduce budget_s=5" in made.stdout
    assert "dcp-bench reproduce exited 4" in made.stderr
    script = subprocess.run(
        [str(REPO / "scripts" / "reproduce.sh"), "budget_s=5"],
        capture_output=True,
        text=True,
        env=env,
        timeout=60,
    )
    assert script.returncode == 4, script.stderr
    assert "ran: reproduce budget_s=5" in script.stdout


@pytest.mark.skipif(shutil.which("make") is None, reason="needs GNU make")
def test_make_setup_says_which_step_it_is_on(tmp_path: Path) -> None:
    """A fresh clone's set-up takes minutes: every step is named as it starts (a stand-in
    Python that answers every call, so nothing is installed)."""
    venv = tmp_path / "venv"
    (venv / "bin").mkdir(parents=True)
    exe = venv / "bin" / "python"
    exe.write_text("#!/bin/sh\nexit 0\n")
    exe.chmod(0o755)
    made = subprocess.run(
        ["make", "-s", "-C", str(REPO), "setup", f"VENV={venv}"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert made.returncode == 0, made.stderr
    steps = [ln for ln in made.stdout.splitlines() if ln.startswith("setup: ")]
    assert [s.split(" ", 2)[1] for s in steps] == ["1/3", "2/3", "3/3", "done"]
    assert "torch" in steps[1] and "dcp-bench" in steps[2]
    assert (venv / ".installed").exists()
