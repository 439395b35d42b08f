"""Locations of the project's data folders (the suite runs from a checkout, installed editable)."""

from __future__ import annotations

from pathlib import Path

PACKAGE_DIR = Path(__file__).resolve().parent
REPO_ROOT = PACKAGE_DIR.parent
CONF_DIR = PACKAGE_DIR / "conf"
WORKLOADS_DIR = REPO_ROOT / "workloads"
RESULTS_DIR = REPO_ROOT / "results"
REPORTS_DIR = REPO_ROOT / "reports"
