"""docs/extending.md, "Add an architecture", followed literally: its files are written into an
empty folder and its commands run there (this checkout's `dcp_bench`, as a subprocess). The new
architecture is one module and one YAML, it plans and simulates, and it is priced as its module
says (attention FLOPs twice the causal Llama's of the same sizes; n^2 query-key pairs)."""

from __future__ import annotations

import json
import os
import shlex
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from dcp_bench.paths import REPO_ROOT

DOC = REPO_ROOT / "docs" / "extending.md"
HEADING = "## Add an architecture"

sys.path.insert(0, str(Path(__file__).parent))
from test_extending import doc_commands, section_steps  # noqa: E402


def _env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k != "DCP_BENCH_CONF_PATH"}
    env["PYTHONPATH"] = str(REPO_ROOT)  # this checkout's dcp_bench, not the user's folder
    env["OMP_NUM_THREADS"] = "1"
    return env


def test_the_recipe_is_one_module_and_one_yaml() -> None:
    files = [p for _, p, _ in section_steps(HEADING) if p]
    assert len(files) == 2, files
    assert sum(p.endswith(".py") for p in files) == 1
    assert sum(p.startswith("my_conf/model/") and p.endswith(".yaml") for p in files) == 1


def test_following_the_recipe_plans_simulates_and_prices_the_new_architecture(
    tmp_path: Path,
) -> None:
    env = _env()
    simulated = None
    for lang, path, body in section_steps(HEADING):
        if path:
            (tmp_path / path).parent.mkdir(parents=True, exist_ok=True)
            (tmp_path / path).write_text(body)
        elif lang == "bash":
            for line in doc_commands(body):
                argv = shlex.split(line)
                assert argv[0] == "dcp-bench", line
                json_out = argv[1] == "simulate"
                cmd = [sys.executable, "-m", "dcp_bench.cli", *argv[1:]]
                res = subprocess.run(
                    [*cmd, *(["--json"] if json_out else [])],
                    cwd=tmp_path,
                    env=env,
                    capture_output=True,
                    text=True,
                    timeout=600,
                )
                assert res.returncode == 0, f"{line}\n{res.stdout}\n{res.stderr}"
                if json_out:
                    simulated = json.loads(res.stdout)
    assert simulated is not None and simulated["status"] == "ok"
    assert simulated["model"] == "bidir_small"

    # the same module, imported as the CLI imported it, prices what it says
    sys.path.insert(0, str(tmp_path))
    try:
        from dcp_bench.cost import make_cost_model
        from dcp_bench.cost.specs import ModelSpec, model_spec

        enc = model_spec("bidir_small", **_yaml_fields(tmp_path))
        llama = ModelSpec(
            "same_sizes", "llama", enc.num_layers, enc.hidden, enc.heads, enc.kv_heads,
            enc.ffn_hidden, vocab=enc.vocab,
        )  # fmt: skip
        n, f = np.array([1024.0, 4096.0]), np.ones(2)
        a = make_cost_model(enc, "h200x8", "analytical").sample_flops(n, f)  # type: ignore[attr-defined]
        b = make_cost_model(llama, "h200x8", "analytical").sample_flops(n, f)  # type: ignore[attr-defined]
        np.testing.assert_allclose(a["attn"], 2 * b["attn"], rtol=1e-12)
        np.testing.assert_array_equal(a["layer_gemm"], b["layer_gemm"])
        from dcp_bench.archs import arch_of

        np.testing.assert_array_equal(arch_of(enc).attention_pairs(n, f), n * n)
    finally:
        sys.path.remove(str(tmp_path))
        sys.modules.pop("bidir_encoder", None)


def _yaml_fields(folder: Path) -> dict[str, object]:
    import yaml

    data = yaml.safe_load((folder / "my_conf/model/bidir_small.yaml").read_text())
    return {k: v for k, v in data.items() if not k.startswith("_") and k != "name"}


def test_a_runtime_less_architecture_is_refused_by_train_and_memory_on_one_line(
    tmp_path: Path,
) -> None:
    pytest.importorskip("torch")
    from dcp_bench.cost.specs import model_spec
    from dcp_bench.errors import ConfigError
    from dcp_bench.runtime.archs import runtime_arch

    with pytest.raises(ConfigError, match="architecture 'wan'.*has no runtime model"):
        runtime_arch(
            model_spec(
                "w",
                arch="wan",
                num_layers=1,
                hidden=64,
                heads=4,
                kv_heads=4,
                ffn_hidden=128,
                patch=[1, 2, 2],
                text_tokens=8,
                text_dim=32,
            )  # fmt: skip
        )
