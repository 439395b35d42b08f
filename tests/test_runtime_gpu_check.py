"""The one-command GPU check, dry-run on CPU (`scripts/gpu_check.sh --device cpu --tiny --out DIR`):
it passes, writes at most 8 files into DIR and nothing into the repository; the smoke test's
losses and layer gradients equal the fp32 reference; the calibration profiles are readable by the
profiled cost model; a calibration point that fails for any reason is recorded and the others
still run; a kill mid-calibration keeps every finished point; a wrong attention kernel fails the
smoke test (exit status 1); the whole pipeline (buckets, floor, fit, the claim) runs (slow)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from dcp_bench.cost.profiled import ProfiledCostModel
from dcp_bench.cost.specs import model_spec
from dcp_bench.paths import REPO_ROOT
from tools import gpu_calibrate
from tools.gpu_check import MAX_FILES

# The GPU check driven end to end on CPU (a dry run spawns ranks for minutes on 2 cores).
pytestmark = pytest.mark.slow


def _tree(root: Path) -> set[str]:
    return {
        str(p.relative_to(root))
        for p in root.rglob("*")
        if ".venv" not in p.parts
        and ".git" not in p.parts
        and "__pycache__" not in p.parts
        and ".mypy_cache" not in p.parts
        and ".ruff_cache" not in p.parts
    }


def _check(out: Path, *extra: str, timeout: float = 900) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [
            "bash",
            str(REPO_ROOT / "scripts" / "gpu_check.sh"),
            "--device",
            "cpu",
            "--tiny",
            "--out",
            str(out),
            *extra,
        ],
        capture_output=True,
        text=True,
        timeout=timeout,
        cwd=out.parent,
        env={**os.environ, "OMP_NUM_THREADS": "1", "PYTHON": sys.executable},
    )


@pytest.fixture(scope="module")
def dry_run(
    tmp_path_factory: pytest.TempPathFactory,
) -> tuple[subprocess.CompletedProcess[str], Path, set[str]]:
    out = tmp_path_factory.mktemp("gpu_check") / "out"
    before = _tree(REPO_ROOT / "results") | _tree(REPO_ROOT / "scripts")
    # the phases end when their work is done; the budget only bounds a machine under heavy load
    proc = _check(out, "--phases", "kernel,smoke,calibration", "--budget-s", "400")
    after = _tree(REPO_ROOT / "results") | _tree(REPO_ROOT / "scripts")
    return proc, out, after - before


def test_dry_run_passes_and_writes_only_into_its_folder(
    dry_run: tuple[subprocess.CompletedProcess[str], Path, set[str]],
) -> None:
    proc, out, new_in_repo = dry_run
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    files = sorted(p.name for p in out.iterdir())
    assert files == sorted(
        ["check.json", "summary.md", "gpu_check.log", "tiny_llama.json", "tiny_stdit.json"]
    )
    assert len(files) <= MAX_FILES
    assert not new_in_repo
    assert "Verdict (the smoke test): **PASS**" in (out / "summary.md").read_text()
    log = (out / "gpu_check.log").read_text()
    assert "gpu_check: PASS" in log
    # the interpreter is named, in the log and in the provenance
    assert f"gpu_check: interpreter {sys.executable}" in log
    env = json.loads((out / "check.json").read_text())["env"]
    assert env["interpreter"] == sys.executable and env["git_sha"]
    assert {"gpu_memory_bytes", "gpu_driver", "torch", "cuda"} <= set(env)


def test_smoke_trains_both_models_and_matches_the_reference(dry_run: tuple[Any, Path, Any]) -> None:
    check = json.loads((dry_run[1] / "check.json").read_text())
    smoke = check["smoke"]
    checks = smoke["attention_check"]
    assert [a["tokens"] for a in checks] == [256, 1024] and all(a["passed"] for a in checks)
    assert [m["model"] for m in smoke["models"]] == ["tiny_llama", "tiny_stdit"]
    for m in smoke["models"]:
        assert len(m["steps"]) == 3 and m["layers"] == 1
        losses = [st["losses"] for st in m["steps"]]
        for got in losses:
            assert abs(got["runtime"] - got["reference_fp32"]) <= 1e-5 * got["reference_fp32"]
        for st in m["steps"]:
            # every parameter tensor's gradient equals the fp32 reference's (fp32 on both sides)
            assert (
                st["gradients"]["tensors"] > 5 and st["gradients"]["worst_rel_l2"]["rel_l2"] <= 1e-5
            )
        assert len({round(x["runtime"], 6) for x in losses}) == 3  # three different steps
        for st in m["steps"]:
            mem = st["memory"]
            assert st["finite"] and mem["measured_peak_bytes"] > 0 and mem["predicted_bytes"] > 0
            # the state holds what the policy (the cost models' source) says
            assert (
                abs(mem["state_bytes"] - sum(mem["policy_state_bytes"].values()))
                <= 0.01 * mem["state_bytes"]
            )
    kernel = check["kernel"]
    assert kernel["selected"]["kernel"] == "sdpa" and all(
        r["fwd_bwd_s"] > 0 for r in kernel["throughput"]
    )
    assert set(check["phases"]) == {"kernel", "smoke", "calibration"}
    assert all("ended_s" in ph for ph in check["phases"].values())


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
    assert art["failures"] == [
        {
            "tokens_per_rank": 128,
            "shape": "packed",
            "error": "ValueError: kernel rejected the shape",
        }
    ]
    measured = {(p["tokens_per_rank"], p["shape"]) for p in art["layers"]}
    assert (
        (128, "single") in measured
        and (256, "packed") in measured
        and (128, "packed") not in measured
    )
    with pytest.raises(RuntimeError, match="no grid point"):
        gpu_calibrate.calibrate_model("tiny_llama", "cpu", True, 1, time.time() - 1, "test")


def test_a_wrong_attention_kernel_fails_the_smoke_test(tmp_path: Path) -> None:
    """The kernel without its causal mask moves an initialised model's loss by well under the
    loss tolerance; the element-wise attention check and the layer gradients catch it."""
    out = tmp_path / "out"
    proc = _check(out, "--phases", "kernel,smoke", "--fault", "attention")
    assert proc.returncode == 1, proc.stdout[-3000:] + proc.stderr[-3000:]
    summary = (out / "summary.md").read_text()
    assert "Verdict (the smoke test): **FAIL**" in summary
    problems = [ln for ln in proc.stdout.splitlines() if ln.startswith("gpu_check: problem:")]
    assert any("attention check at 256 tokens" in p for p in problems)
    assert any("tiny_llama step" in p and "layer gradient" in p for p in problems)
    smoke = json.loads((out / "check.json").read_text())["smoke"]
    assert not any(a["passed"] for a in smoke["attention_check"])


def test_a_kill_mid_calibration_keeps_the_finished_points(tmp_path: Path) -> None:
    out = tmp_path / "out"
    out.mkdir()
    path = out / "tiny_llama.json"
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "tools.gpu_check",
            "--device",
            "cpu",
            "--tiny",
            "--phases",
            "calibration",
            "--out",
            str(out),
        ],
        cwd=REPO_ROOT,
        start_new_session=True,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        env={**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(REPO_ROOT)},
    )
    try:
        end = time.time() + 300
        points = 0
        while time.time() < end and proc.poll() is None:
            if path.exists():
                points = len(json.loads(path.read_text())["layers"])
                if points >= 2:
                    break
            time.sleep(0.2)
        assert points >= 2, "the calibration wrote no partial profile"
        os.killpg(proc.pid, signal.SIGKILL)  # the whole process group: the check and its point
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=60)
    art = json.loads(path.read_text())  # whole (written atomically) and readable
    assert not art["complete"] and art["pending"]
    measured = {(p["tokens_per_rank"], p["shape"]) for p in art["layers"]}
    assert len(measured) >= 2 and not measured & {
        (p["tokens_per_rank"], p["shape"]) for p in art["pending"]
    }
    assert (out / "check.json").exists() and (out / "summary.md").exists()
    assert "ended_s" not in json.loads((out / "check.json").read_text())["phases"]["calibration"]


@pytest.mark.slow
@pytest.mark.timeout(1300)
def test_the_whole_pipeline_runs_in_tiny_form(tmp_path: Path) -> None:
    """Every phase: the STDiT bucket search, the floor, the fit and the claim on the fitted model,
    eight files at most."""
    import tarfile

    import yaml

    out = tmp_path / "out"
    # a budget every phase can finish its tiny share in on a busy 2-core machine
    proc = _check(out, "--budget-s", "400", timeout=1200)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "gpu_check: note:" not in proc.stdout, proc.stdout[-3000:]
    files = sorted(p.name for p in out.iterdir())
    assert files == sorted(
        [
            "check.json",
            "summary.md",
            "gpu_check.log",
            "tiny_llama.json",
            "tiny_stdit.json",
            "stdit_buckets.json",
            "cpu_constants.yaml",
            "claim.tar.gz",
        ]
    )
    buckets = json.loads((out / "stdit_buckets.json").read_text())
    assert len(buckets["buckets"]) >= 2
    first = buckets["buckets"][0]
    assert first["bucket"] == "144p image"  # the smallest first, then the longest video
    assert buckets["buckets"][1]["bucket"] == "720px408f"
    for b in buckets["buckets"]:
        for kind, trials in (
            ("no_ckpt", [t for t in b["trials"] if t["ckpt_layers"] == 0]),
            ("ckpt", [t for t in b["trials"] if t["ckpt_layers"] > 0]),
        ):
            if kind not in b["chosen"]:
                continue
            # the reference's search: 1, 2, 4, ... up to the first that does not fit
            assert [t["bs"] for t in trials] == [2**i for i in range(len(trials))]
            assert all(t["fits"] for t in trials[:-1]) and not trials[-1]["fits"]
    fit = yaml.safe_load((out / "cpu_constants.yaml").read_text())
    assert set(fit["cost_constants"]) == {"gemm_half_flops", "attn_eff_max", "attn_half_len"}
    assert fit["median_rel_err_after"] <= fit["median_rel_err_before"]
    with tarfile.open(out / "claim.tar.gz") as tar:
        assert "claim/report.md" in tar.getnames()
    assert json.loads((out / "check.json").read_text())["claim"]["exit_status"] == 0
