"""The offline kit (`scripts/offline_kit.sh`, `make kit`): the project's wheel builds with no
network and installs with ``pip --no-index`` into a fresh virtual environment; the full kit's
download commands target CPython 3.12 wheels only. With ``$DCP_BENCH_KIT`` naming a full kit
built earlier (`make kit`), every wheel in it installs the same way and its packages import."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from dcp_bench.paths import REPO_ROOT

KIT_SCRIPT = REPO_ROOT / "scripts" / "offline_kit.sh"


def _run(cmd: list[str], **kw: object) -> subprocess.CompletedProcess[str]:
    return subprocess.run(cmd, capture_output=True, text=True, timeout=600, check=False, **kw)  # type: ignore[call-overload]


def test_the_full_kit_downloads_python_312_wheels_only(tmp_path: Path) -> None:
    proc = _run(
        ["bash", str(KIT_SCRIPT), "--print", str(tmp_path / "kit")],
        env={**os.environ, "PYTHON": sys.executable},
    )
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    downloads = [ln for ln in lines if " pip download " in ln]
    assert len(downloads) == 2 and all(
        "--only-binary=:all:" in ln and "--python-version 3.12" in ln for ln in downloads
    )
    names = " ".join(lines)
    for pkg in ("hydra-core", "omegaconf", "antlr4-python3-runtime", "highspy"):
        assert pkg in names
    assert "--no-index" in lines[0]  # the project's own wheel is built from the checkout


@pytest.mark.slow
def test_the_kit_installs_offline_into_a_fresh_venv(tmp_path: Path) -> None:
    kit = tmp_path / "kit"
    proc = _run(
        ["bash", str(KIT_SCRIPT), "--project-only", str(kit)],
        env={**os.environ, "PYTHON": sys.executable},
    )
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    wheels = sorted(p.name for p in kit.glob("*.whl"))
    assert len(wheels) == 1 and wheels[0].startswith("dcp_bench-")
    full = os.environ.get("DCP_BENCH_KIT")
    if full:
        wheels_from = Path(full)
        assert (wheels_from / "MANIFEST.txt").exists(), (
            f"$DCP_BENCH_KIT={full}: not a kit (no MANIFEST.txt)"
        )
        for whl in wheels_from.glob("*.whl"):
            if not whl.name.startswith("dcp_bench-"):
                (kit / whl.name).write_bytes(whl.read_bytes())
    venv = tmp_path / "venv"
    proc = _run([sys.executable, "-m", "venv", str(venv)])
    assert proc.returncode == 0, proc.stderr
    py = venv / "bin" / "python"
    # no PYTHONPATH: the checkout must not stand in for the installed package
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    proc = _run(
        [
            str(py),
            "-m",
            "pip",
            "install",
            "-q",
            "--no-index",
            "--find-links",
            str(kit),
            "--no-deps",
            *[str(p) for p in sorted(kit.glob("*.whl"))],
        ],
        cwd=tmp_path,
        env=env,
    )
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    probe = (
        "import importlib.metadata as m, dcp_bench, pathlib; p = "
        "pathlib.Path(dcp_bench.__file__).parent; print(m.version('dcp-bench'), p, (p / 'conf' / "
        "'reproduce' / 'default.yaml').is_file())"
    )
    proc = _run([str(py), "-c", probe], cwd=tmp_path, env=env)
    assert proc.returncode == 0, proc.stderr
    version, where, conf = proc.stdout.split()
    assert version == "0.1.0" and str(venv) in where and conf == "True"
    if full and sys.version_info[:2] == (3, 12):
        proc = _run(
            [str(py), "-c", "import omegaconf, hydra, antlr4, highspy"], cwd=tmp_path, env=env
        )
        assert proc.returncode == 0, proc.stderr
