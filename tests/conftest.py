"""Shared test fixtures, and the suite's defences against a busy machine.

On a loaded machine a lazy import can take minutes. torch imports ``torch._dynamo`` (and sympy
with it) the first time a model is built on the meta device; done inside a test or fixture, the
test timeout could fire in the middle of that import and leave a half-imported module behind,
failing every later test of the process. So: the heavy imports are done once, after collection
and before the first test, where no timeout runs (`pytest_collection_finish`); and the timeout
bounds each test's own function, never a fixture (``timeout_func_only`` in pyproject.toml), so a
slow fixture can be slow but is never interrupted half-way.
"""

from __future__ import annotations

import importlib
import os
import sys

import pytest

# One thread per process keeps results reproducible (thread count changes low bits) and stops
# tests from oversubscribing the small CI machine.
os.environ.setdefault("OMP_NUM_THREADS", "1")

# What torch imports lazily on first use (building a model on the meta device, nn.init under a
# device context): imported up front whenever a collected test module uses torch.
HEAVY_LAZY_IMPORTS = ("torch._dynamo", "sympy")


def pytest_collection_finish(session: pytest.Session) -> None:
    if "torch" not in sys.modules or not session.items:
        return
    for name in HEAVY_LAZY_IMPORTS:
        importlib.import_module(name)
