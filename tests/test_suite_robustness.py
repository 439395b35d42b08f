"""The suite under load: the test timeout never interrupts a fixture (a fixture cut mid-import
left a half-imported module that failed every later test), a test over its timeout fails alone,
and torch's heavy lazy imports are done before the first test (tests/conftest.py)."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]

INNER = """
import time
import pytest


@pytest.fixture(scope="module")
def slow_setup():
    time.sleep(3)  # longer than the timeout: a busy machine building a model
    return 1


def test_after_a_slow_fixture(slow_setup):
    assert slow_setup == 1


def test_over_its_own_timeout():
    time.sleep(30)


def test_the_next_one_runs(slow_setup):
    assert slow_setup == 1
"""


def test_timeout_spares_fixtures_and_one_failure_stays_one(tmp_path: Path) -> None:
    shutil.copy(REPO / "tests" / "conftest.py", tmp_path / "conftest.py")
    (tmp_path / "test_inner.py").write_text(INNER)
    ini = "[pytest]\ntimeout = 2\ntimeout_func_only = true\n"
    (tmp_path / "pytest.ini").write_text(ini)
    out = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", str(tmp_path)],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
    )
    tail = out.stdout.strip().splitlines()[-1]
    assert "1 failed, 2 passed" in tail, out.stdout[-2000:]
    assert "test_over_its_own_timeout" in out.stdout and "Timeout" in out.stdout


def test_the_project_config_bounds_functions_only() -> None:
    text = (REPO / "pyproject.toml").read_text()
    assert "timeout_func_only = true" in text


@pytest.mark.slow
def test_heavy_lazy_imports_are_done_before_the_first_test(tmp_path: Path) -> None:
    shutil.copy(REPO / "tests" / "conftest.py", tmp_path / "conftest.py")
    (tmp_path / "test_uses_torch.py").write_text(
        "import sys\nimport torch  # noqa: F401\n\n\n"
        "def test_lazy_parts_already_there():\n"
        "    assert 'torch._dynamo' in sys.modules and 'sympy' in sys.modules\n"
    )
    out = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", str(tmp_path)],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert "1 passed" in out.stdout, out.stdout[-2000:]
