"""`dcp-bench launch`: a user's own script on local ranks, a refusal on one line (rank 0's), the
ranks' tracebacks in the log."""

from __future__ import annotations

from pathlib import Path

import pytest

from dcp_bench.cli import main
from dcp_bench.run.script_rank import main as rank_main
from dcp_bench.run.torch_run import RANK_ERROR_MARK

REFUSING = """
import sys
import torch.distributed as dist
from transformers import AutoModelForCausalLM, LlamaConfig
from dcp_bench.runtime.integrations.transformers_lm import CausalLMAdapter

dist.init_process_group("gloo")
config = LlamaConfig(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                     num_attention_heads=4, num_key_value_heads=2, attention_dropout=0.1)
print("rank", dist.get_rank(), "starts", sys.argv[1:])
CausalLMAdapter(AutoModelForCausalLM.from_config(config))
"""


def test_a_rank_marks_its_scripts_exception_and_keeps_its_exit_code(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("RANK", "0")
    script = tmp_path / "s.py"
    script.write_text("import sys\nif sys.argv[1] == 'raise':\n    raise ValueError('no\\nway')\n"
                      "sys.exit(int(sys.argv[1]))\n")  # fmt: skip
    assert rank_main([str(script), "raise"]) == 1
    err = capsys.readouterr().err
    assert "Traceback" in err and f"{RANK_ERROR_MARK} rank 0: ValueError: no way\n" in err
    assert rank_main([str(script), "3"]) == 3 and rank_main([str(script), "0"]) == 0
    assert RANK_ERROR_MARK not in capsys.readouterr().err


@pytest.mark.dist
@pytest.mark.slow  # one torchrun launch
@pytest.mark.timeout(300)
def test_a_refusal_in_a_users_script_is_one_line_with_the_traces_in_the_log(
    tmp_path: Path, capfd: pytest.CaptureFixture[str]
) -> None:
    pytest.importorskip("transformers")
    script, log = tmp_path / "train.py", tmp_path / "ranks.log"
    script.write_text(REFUSING)
    assert main(["launch", "--nproc", "2", "--log", str(log), str(script), "--steps", "3"]) == 1
    out, err = capfd.readouterr()
    assert "rank 0 starts ['--steps', '3']" in out  # the ranks' stdout is shown, args passed
    lines = [ln for ln in err.splitlines() if ln.strip()]
    assert len(lines) == 1, err
    assert lines[0].startswith("dcp-bench launch: rank 0: ConfigError: LlamaAttention: ")
    assert "attention argument dropout=0.1" in lines[0] and str(log) in lines[0]
    assert "Traceback (most recent call last)" in log.read_text()
