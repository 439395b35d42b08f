"""The one-command GPU check, dry-run on CPU (`scripts/gpu_check.sh --device cpu --tiny --out DIR`):
it passes, writes at most 8 files into DIR and nothing into the repository; the smoke test's
losses equal the fp32 reference; the calibration profiles are readable by the profiled cost model;
a calibration point that fails for any reason is recorded and the others still run."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from dcp_bench.cost.profiled import ProfiledCostModel
from dcp_bench.cost.specs import model_spec
from dcp_bench.paths import REPO_ROOT
from dcp_bench.profiling import gpu_calibrate
from dcp_bench.profiling.gpu_check import MAX_FILES


def _tree(root: Path) -> set[str]:
    return {str(p.relative_to(root)) for p in root.rglob("*") if ".venv" not in p.parts and ".git" not in p.parts
            and "__pycache__" not in p.parts and ".mypy_cache" not in p.parts and ".ruff_cache" not in p.parts}


@pytest.fixture(scope="module")
def dry_run(tmp_path_factory: pytest.TempPathFactory) -> tuple[subprocess.CompletedProcess[str], Path, set[str]]:
    out = tmp_path_factory.mktemp("gpu_check") / "out"
    before = _tree(REPO_ROOT / "results") | _tree(REPO_ROOT / "scripts")
    proc = subprocess.run(["bash", str(REPO_ROOT / "scripts" / "gpu_check.sh"), "--device", "cpu", "--tiny", "--out", str(out)],
                          capture_output=True, text=True, timeout=900, cwd=out.parent,
                          env={**os.environ, "OMP_NUM_THREADS": "1"})
    after = _tree(REPO_ROOT / "results") | _tree(REPO_ROOT / "scripts")
    return proc, out, after - before


def test_dry_run_passes_and_writes_only_into_its_folder(dry_run: tuple[subprocess.CompletedProcess[str], Path, set[str]]) -> None:
    proc, out, new_in_repo = dry_run
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    files = sorted(p.name for p in out.iterdir())
    assert files == sorted(["env.json", "kernel.json", "smoke.json", "summary.md", "gpu_check.log",
                            "tiny_llama.json", "tiny_stdit.json"])
    assert len(files) <= MAX_FILES
    assert not new_in_repo
    assert "Verdict: **PASS**" in (out / "summary.md").read_text()
    assert "gpu_check: PASS" in (out / "gpu_check.log").read_text()


def test_smoke_trains_both_models_and_matches_the_reference(dry_run: tuple[Any, Path, Any]) -> None:
    smoke = json.loads((dry_run[1] / "smoke.json").read_text())
    assert [m["model"] for m in smoke["models"]] == ["tiny_llama", "tiny_stdit"]
    for m in smoke["models"]:
        assert len(m["steps"]) == 3 and m["layers"] == 1
        losses = [st["losses"] for st in m["steps"]]
        for got in losses:
            assert abs(got["runtime"] - got["reference_fp32"]) <= 1e-5 * got["reference_fp32"]
        assert len({round(x["runtime"], 6) for x in losses}) == 3  # three different steps
        for st in m["steps"]:
            mem = st["memory"]
            assert st["finite"] and mem["measured_peak_bytes"] > 0 and mem["predicted_bytes"] > 0
            # the state holds what the policy (the cost models' source) says
            assert abs(mem["state_bytes"] - sum(mem["policy_state_bytes"].values())) <= 0.01 * mem["state_bytes"]
    kernel = json.loads((dry_run[1] / "kernel.json").read_text())
    assert kernel["selected"]["kernel"] == "sdpa" and all(r["fwd_bwd_s"] > 0 for r in kernel["throughput"])


def test_calibration_profiles_feed_the_profiled_cost_model(dry_run: tuple[Any, Path, Any]) -> None:
    from test_profiling import cpu_cluster

    for name in ("tiny_llama", "tiny_stdit"):
        path = dry_run[1] / f"{name}.json"
        art = json.loads(path.read_text())
        assert art["failures"] == [] and art["settings"]["device"] == "cpu"
        assert {p["tokens_per_rank"] for p in art["layers"]} >= set(gpu_calibrate.TINY_TOKENS)
        cost = ProfiledCostModel(model=model_spec(name), cluster=cpu_cluster(1), profile=str(path))
        assert cost.sample_time(np.array([256]), np.array([1]), 1, 0)[0] > 0


def test_a_failing_point_is_recorded_and_the_rest_measured(monkeypatch: pytest.MonkeyPatch) -> None:
    real = gpu_calibrate.run_profile

    def flaky(req: Any, command: str = "") -> dict[str, Any]:
        if req.tokens == [128] and req.shapes == ["packed"]:
            raise ValueError("kernel rejected the shape")  # not an out-of-memory error
        return real(req, command=command)

    monkeypatch.setattr(gpu_calibrate, "run_profile", flaky)
    import time

    art = gpu_calibrate.calibrate_model("tiny_llama", "cpu", True, 1, time.time() + 600, "test")
    assert art["failures"] == [{"tokens_per_rank": 128, "shape": "packed", "error": "ValueError: kernel rejected the shape"}]
    measured = {(p["tokens_per_rank"], p["shape"]) for p in art["layers"]}
    assert (128, "single") in measured and (256, "packed") in measured and (128, "packed") not in measured
    with pytest.raises(RuntimeError, match="no grid point"):
        gpu_calibrate.calibrate_model("tiny_llama", "cpu", True, 1, time.time() - 1, "test")
