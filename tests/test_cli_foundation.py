"""The CLI, config composition and `dcp-bench env`."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from dcp_bench.cli import main
from dcp_bench.config import GROUPS, config_hash, group_choices, instantiate, load_config
from dcp_bench.errors import ConfigError

ENV_KEYS = {
    "python",
    "torch",
    "cuda",
    "nccl",
    "gpu_model",
    "gpu_count",
    "cpu_model",
    "cpu_cores",
    "memory_bytes",
    "hostname",
    "git_sha",
    "git_dirty",
    "dependencies",
}


def test_env_json_has_the_documented_keys(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["env"]) == 0
    info = json.loads(capsys.readouterr().out)
    assert set(info) >= ENV_KEYS
    assert info["cpu_cores"] >= 1 and info["memory_bytes"] > 0
    import torch

    assert info["torch"] == torch.__version__
    if not torch.cuda.is_available():
        assert info["cuda"] is None and info["nccl"] is None and info["gpu_count"] == 0
    for dep in ("torch", "hydra-core", "numpy", "pandas", "pyarrow", "seaborn", "matplotlib"):
        assert info["dependencies"][dep], dep


@pytest.mark.parametrize("group", GROUPS)
def test_every_config_in_the_root_composes(group: str) -> None:
    choices = group_choices(group)
    assert choices, f"config group {group} is empty"
    for choice in choices:
        cfg = load_config([f"{group}={choice}"])
        assert group in cfg


@pytest.mark.parametrize("name", group_choices("cluster"))
def test_every_cluster_and_model_builds(name: str) -> None:
    cfg = load_config([f"cluster={name}"])
    cluster = instantiate(cfg.cluster)
    assert cluster.world_size == cluster.num_nodes * cluster.gpus_per_node
    for model in group_choices("model"):
        spec = instantiate(load_config([f"model={model}"]).model)
        assert spec.name == model and spec.hidden % spec.heads == 0


def test_unknown_group_value_names_the_choices() -> None:
    with pytest.raises(ConfigError) as err:
        load_config(["cluster=h200x7"])
    msg = str(err.value)
    assert "h200x7" in msg and "h200x32" in msg and "\n" not in msg


def test_bad_override_form() -> None:
    with pytest.raises(ConfigError, match="key=value"):
        load_config(["cluster"])


def test_config_hash_ignores_excluded_keys() -> None:
    a = load_config(["seed=1"])
    b = load_config(["seed=2"])
    assert config_hash(a, exclude=["seed"]) == config_hash(b, exclude=["seed"])
    assert config_hash(a) != config_hash(b)


def _cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "dcp_bench.cli", *args], capture_output=True, text=True, timeout=120
    )


def test_unknown_subcommand_is_one_line_exit_2() -> None:
    res = _cli("frobnicate")
    assert res.returncode == 2
    err = res.stderr.strip()
    assert "\n" not in err and "frobnicate" in err and "env" in err
    assert "Traceback" not in res.stderr


def test_help_lists_subcommands() -> None:
    res = _cli("--help")
    assert res.returncode == 0 and "env" in res.stdout


def test_a_closed_pipe_ends_quietly() -> None:
    """`dcp-bench ... | head`: the reader goes away; the command stops with status 141 (as Unix
    tools do on SIGPIPE) and no traceback."""
    import subprocess
    import sys

    proc = subprocess.Popen(
        [sys.executable, "-m", "dcp_bench.cli", "plan", "workload=videosys_zipf", "--json"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    assert proc.stdout is not None and proc.stderr is not None
    proc.stdout.read(10)
    proc.stdout.close()
    err = proc.stderr.read().decode()
    assert proc.wait(timeout=120) == 141 and "Traceback" not in err
