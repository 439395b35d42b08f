"""Counting a test's processes: a tag the test puts in the environment is inherited by every
process it starts, whatever session or parent they end up with (Linux /proc)."""

from __future__ import annotations

import contextlib
import os
import signal
from pathlib import Path

TAG = "DCP_BENCH_TEST_TAG"
HAS_PROC = Path("/proc/self/environ").exists()


def tagged(tag: str) -> list[int]:
    """Live (non-zombie) processes whose environment holds ``TAG=tag``."""
    out = []
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            env = Path(f"/proc/{name}/environ").read_bytes().split(b"\0")
            state = Path(f"/proc/{name}/stat").read_bytes().rsplit(b")", 1)[-1].split()[0]
        except (OSError, IndexError):
            continue
        if f"{TAG}={tag}".encode() in env and state not in (b"Z", b"X"):
            out.append(int(name))
    return out


def kill_tagged(tag: str) -> None:
    """SIGKILL whatever still carries ``tag`` (a failing test must not leave processes behind)."""
    for pid in tagged(tag):
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
