"""Shared test fixtures."""

from __future__ import annotations

import os

# One thread per process keeps results reproducible (thread count changes low bits) and stops
# tests from oversubscribing the small CI machine.
os.environ.setdefault("OMP_NUM_THREADS", "1")
