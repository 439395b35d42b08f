"""``model=hf`` with the decoder families registered in `dcp_bench.archs` beyond Llama, Mistral and
Qwen2: Qwen3 (per-head q/k norms, a 128-wide head), Gemma (GeGLU, a 256-wide head, tied
embeddings) and OLMo2 (full-width q/k norms) are planned, simulated and trained on two gloo ranks
without a refusal, each priced with its own structure."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from dcp_bench.cli import main
from dcp_bench.cost.specs import model_spec

FAMILIES = {
    # model_type -> (option, value) its spec must carry: the structure the cost model prices
    "qwen3": ("qk_head_norm", "head"),
    "gemma": ("mlp", "geglu"),
    "olmo2": ("qk_head_norm", "full"),
}
RUN = [
    "workload=synthetic_uniform",
    "workload.low=16",
    "workload.high=200",
    "workload.tokens_per_gpu=400",
    "method=dcp",
    "model=hf",
]


def _config(model_type: str) -> dict[str, object]:
    """The default model=hf config (conf/model/hf.yaml) with another model_type."""
    import yaml

    from dcp_bench.paths import CONF_DIR

    cfg = dict(yaml.safe_load((CONF_DIR / "model" / "hf.yaml").read_text())["config"])
    return {**cfg, "model_type": model_type}


@pytest.mark.parametrize("model_type", sorted(FAMILIES))
def test_family_is_priced_with_its_own_structure(model_type: str) -> None:
    spec = model_spec("hf", library="transformers", config=_config(model_type))
    key, value = FAMILIES[model_type]
    assert getattr(spec, key) == value
    plain = model_spec("hf", library="transformers", config=_config("llama"))
    # the same sizes priced as a plain Llama would be another model
    from dcp_bench.cost.params import param_count

    assert param_count(spec) != param_count(plain)


@pytest.mark.parametrize("model_type", sorted(FAMILIES))
def test_family_plans_and_simulates_without_refusal(
    model_type: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    run = [*RUN, f"model.config.model_type={model_type}", "cluster=cpu"]
    assert main(["plan", *run]) == 0, capsys.readouterr().err
    capsys.readouterr()
    assert main(["simulate", *run, "steps=2", "--json"]) == 0, capsys.readouterr().err
    summary = json.loads(capsys.readouterr().out)
    assert summary["status"] == "ok" and summary["n_steps"] == 2
    assert summary["step_time_s"] > 0


@pytest.mark.slow  # one torchrun launch of 2 gloo ranks per family
@pytest.mark.dist
@pytest.mark.timeout(900)
@pytest.mark.parametrize("model_type", sorted(FAMILIES))
def test_family_trains_on_two_gloo_ranks(
    model_type: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    pytest.importorskip("transformers")
    run = [*RUN, f"model.config.model_type={model_type}", "nproc=2", "steps=1"]
    assert main(["train", *run, f"root={tmp_path}"]) == 0, capsys.readouterr().out
    (record,) = tmp_path.rglob("run.json")
    summary = json.loads(record.read_text())
    assert summary["status"] == "ok" and summary["error"] is None and summary["n_steps"] == 1
    config = (record.parent / "config.yaml").read_text()
    assert f"model_type: {model_type}" in config
