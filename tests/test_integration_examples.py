"""The library examples: each DCP version, on 2 gloo ranks, trains exactly like its plain
single-process loop (same per-step losses on the same data), and docs/integration.md states the
line counts the diff gives (`dcp_bench.report.adoption`), not numbers typed by hand."""

from __future__ import annotations

import json
import logging
import os
import re
import sys
import tempfile
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.multiprocessing as mp
from test_api import _free_port, load_example

from dcp_bench.paths import REPO_ROOT
from dcp_bench.report.adoption import EXAMPLES, adoption_rows, code_lines, count_changed_lines

STEPS = 2


def _run_example(rank: int, world: int, port: int, name: str, steps: int, out: str) -> None:
    os.environ.update(
        {
            "RANK": str(rank),
            "WORLD_SIZE": str(world),
            "MASTER_ADDR": "127.0.0.1",
            "MASTER_PORT": str(port),
        }
    )
    torch.set_num_threads(1)
    sys.path.insert(0, str(REPO_ROOT))
    import torch.distributed as dist

    degrees: list[list[int]] = []  # what rank 0 logs per step: the plan's SP degrees

    class Degrees(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            degrees.append(list(getattr(record, "sp_degrees", [])))

    log = logging.getLogger("dcp_bench.api")
    log.setLevel(logging.INFO)
    log.addHandler(Degrees())
    try:
        losses = load_example(name).train(steps)
        if rank == 0:
            Path(out).write_text(json.dumps({"losses": losses, "sp_degrees": degrees}))
    finally:
        dist.destroy_process_group()


def _plain_and_dcp(library: str) -> tuple[list[float], list[float], list[list[int]]]:
    """The plain loop's losses, the DCP example's on 2 ranks, and its plans' SP degrees."""
    torch.set_num_threads(1)
    plain = load_example(f"{library}_plain").train(STEPS)
    with tempfile.TemporaryDirectory() as tmp:
        out = os.path.join(tmp, "losses.json")
        mp.spawn(
            _run_example, args=(2, _free_port(), f"{library}_dcp", STEPS, out), nprocs=2, join=True
        )
        got = json.loads(Path(out).read_text())
        return plain, got["losses"], got["sp_degrees"]


@pytest.mark.dist
@pytest.mark.parametrize("library", ["transformers", "diffusers"])
def test_dcp_example_trains_like_the_plain_loop(library: str) -> None:
    pytest.importorskip(library, reason=f"{library} not installed: pip install -e '.[hf]'")
    plain, dcp, degrees = _plain_and_dcp(library)
    assert len(plain) == len(dcp) == len(degrees) == STEPS
    # the documented sizes make the planner split a sample over both ranks in some step, so the
    # equality covers sequence parallelism, not data parallelism alone
    assert any(max(d) > 1 for d in degrees), degrees
    # the same gradient every step -> the same trajectory, up to the order of floating-point sums
    np.testing.assert_allclose(dcp, plain, rtol=2e-5, atol=0)


def test_line_count_is_a_diff_of_code_lines(tmp_path: Path) -> None:
    a = tmp_path / "a.py"
    b = tmp_path / "b.py"
    a.write_text('"""doc\nstring"""\n\nimport x\n# note\ny = 1\nz = 2\n')
    b.write_text('"""other\ndoc"""\nimport x\nimport w\ny = 1\nz = 3  # changed\n')
    assert code_lines(a.read_text()) == ["import x", "y = 1", "z = 2"]
    n = count_changed_lines(a, b)
    assert (n.added, n.removed, n.plain_lines) == (2, 1, 3)


def test_docs_state_the_counted_lines() -> None:
    doc = (REPO_ROOT / "docs" / "integration.md").read_text()
    rows = {r["library"]: r for r in adoption_rows()}
    assert set(rows) == {e.library for e in EXAMPLES}
    for library, row in rows.items():
        m = re.search(
            rf"<!-- count:{library} -->\*\*(\d+) code lines added or rewritten, (\d+) removed\*\*",
            doc,
        )
        assert m, f"docs/integration.md has no count line for {library}"
        assert (int(m.group(1)), int(m.group(2))) == (
            row["lines added or rewritten"],
            row["lines removed"],
        )


def test_claim_reports_carry_the_lines_to_adopt_table() -> None:
    from types import SimpleNamespace

    from dcp_bench.report.adoption import adoption_section
    from dcp_bench.report.document import Document

    doc = Document("t")
    adoption_section(doc, SimpleNamespace(leads_with_claims=True))
    text = doc.to_markdown()
    assert "## Lines to adopt" in text and "about 10 lines" in text
    for row in adoption_rows():
        assert row["example"] in text
    quiet = Document("t")
    adoption_section(quiet, SimpleNamespace(leads_with_claims=False))  # campaign reports: no table
    assert "Lines to adopt" not in quiet.to_markdown()
