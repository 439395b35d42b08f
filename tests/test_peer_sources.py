"""Every peer names the system it reproduces and the defaults its users run, with their sources,
and the report's method glossary shows it (issue: peers as their authors built them)."""

from __future__ import annotations

import yaml

from dcp_bench.config import group_choices
from dcp_bench.paths import PACKAGE_DIR
from dcp_bench.report.first_screen import method_source


def test_every_packaged_peer_config_names_its_source_and_defaults():
    peers = 0
    for name in group_choices("method"):
        node = yaml.safe_load((PACKAGE_DIR / "conf" / "method" / f"{name}.yaml").read_text())
        target = node.get("_target_")
        if target is None:  # a variant inheriting its parent's class
            continue
        if not str(target).startswith("baselines."):
            continue
        peers += 1
        text = method_source(target)
        assert "Defaults" in text, (name, text)
    assert peers >= 6


def test_glossary_source_of_known_and_unknown_classes():
    assert "arXiv 2503.17924" in method_source("baselines.wlb_llm.WLBLLM")
    assert "hybrid_cp_schedule.py" in method_source("baselines.megatron_hybrid_cp.MegatronHybridCP")
    assert "offline tuning" in method_source("baselines.megatron_hybrid_cp.MegatronHybridCPTuned")
    assert method_source("nosuch.module.Planner") == ""
    assert method_source(None) == ""
