"""docs/extending.md, followed step by step: every file it shows is written, every command it
shows is run, and the results are what the page says they are."""

from __future__ import annotations

import re
import shlex
import subprocess
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from dcp_bench.cli import main
from dcp_bench.paths import REPO_ROOT
from dcp_bench.records import iter_summaries

DOC = REPO_ROOT / "docs" / "extending.md"
FENCE = re.compile(r"^```(\w+)(?:[ \t]+(\S+))?[ \t]*\n(.*?)^```[ \t]*$", re.S | re.M)


def doc_steps(text: str) -> list[tuple[str, str, str]]:
    """(kind, path-or-'', body) of every fenced block, in page order."""
    return [(lang, path or "", body) for lang, path, body in FENCE.findall(text)]


def test_doc_has_both_walkthroughs() -> None:
    text = DOC.read_text()
    assert "## Add a baseline" in text and "## Add a dataset" in text
    steps = doc_steps(text)
    files = [p for _, p, _ in steps if p]
    assert "my_conf/method/round_robin.yaml" in files and "my_conf/workload/my_corpus.yaml" in files
    assert sum(1 for k, p, _ in steps if k == "bash" and not p) >= 4


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_follow_extending_doc(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delenv("DCP_BENCH_CONF_PATH", raising=False)
    for kind, path, body in doc_steps(DOC.read_text()):
        if path:
            target = tmp_path / path
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_text(body)
            continue
        if kind != "bash":
            continue
        for line in body.splitlines():
            argv = shlex.split(line)
            if not argv:
                continue
            if argv[0] == "dcp-bench":
                assert main(argv[1:]) == 0, line
            elif argv[0] == "python":
                subprocess.run([sys.executable, *argv[1:]], check=True, cwd=tmp_path)
            else:
                raise AssertionError(f"the doc runs a command this test does not know: {line}")

    runs = list(iter_summaries(tmp_path / "runs", "extending"))
    by = {(s.workload, s.method) for s in runs if s.status == "ok"}
    # the toy planner, registered by config alone, ran on both workloads; the new dataset has its name
    assert ("sharegpt", "round_robin") in by and ("my_corpus", "round_robin") in by
    assert ("my_corpus", "dcp") in by
    assert sum(1 for s in runs if s.workload == "my_corpus" and s.method == "round_robin") == 5

    # the named workload draws its lengths from the file (truncated at most to the model's limit)
    from dcp_bench.config import load_config, to_container
    from dcp_bench.workload import make_workload

    cfg = to_container(load_config(["extra_conf=my_conf", "workload=my_corpus"]))
    batch = make_workload(cfg["workload"]).global_batch(0, 8)
    allowed = set(np.loadtxt(tmp_path / "my_lengths.txt", dtype=np.int64).tolist())
    assert set(batch.tokens.tolist()) <= allowed

    sp = pd.read_csv(tmp_path / "reports" / "extending" / "tables" / "speedups.csv")
    assert {"round_robin", "bucket_static"} <= set(sp["baseline"])
    assert set(sp["workload"]) >= {"sharegpt", "my_corpus"}
    assert (tmp_path / "reports" / "extending" / "report.html").exists()
