"""Hardware, cluster and model specs: every config loads with numeric fields, matches its
datasheet, and parameter counts equal the real torch modules."""

from __future__ import annotations

import dataclasses

import pytest

from dcp_bench.config import group_choices
from dcp_bench.cost.params import param_breakdown, param_count
from dcp_bench.cost.specs import ClusterSpec, GPUSpec, cluster_spec, gpu_spec, model_spec
from dcp_bench.errors import ClusterError, ConfigError

CLUSTERS = ["h200x8", "h200x16", "h200x32", "h200x64", "h100x32", "cpu"]
MODELS = ["stdit3_xl2", "llama3_8b", "llama2_7b", "tiny_llama", "tiny_stdit"]


@pytest.mark.parametrize("name", CLUSTERS)
def test_clusters_load_with_numbers(name):
    c = cluster_spec(name)
    for spec in (c, c.gpu):
        for f in dataclasses.fields(spec):
            if f.type in ("float", "int"):
                assert isinstance(getattr(spec, f.name), (int, float)), (
                    f"{name}.{f.name} is not a number"
                )
    assert c.gpu.usable_mem_bytes <= c.gpu.mem_bytes
    assert c.world_size in (4, 8, 16, 32, 64)


def test_cluster_names_and_sizes():
    assert set(CLUSTERS) <= set(group_choices("cluster"))
    sizes = {n: cluster_spec(n).world_size for n in CLUSTERS}
    assert sizes == {
        "h200x8": 8,
        "h200x16": 16,
        "h200x32": 32,
        "h200x64": 64,
        "h100x32": 32,
        "cpu": 4,
    }
    assert cluster_spec("h200x32").num_nodes == 4 and cluster_spec("cpu").num_nodes == 1


def test_gpu_datasheet_values():
    h200, h100 = gpu_spec("h200"), gpu_spec("h100")
    assert h200.peak_flops == 989e12 and h100.peak_flops == 989e12
    # Total memory as the driver reports it (datasheet "141 GB" and "80 GB").
    assert h200.mem_bytes == 143771 * 2**20 and h100.mem_bytes == 81559 * 2**20
    assert h200.mem_bw == 4.8e12 and h100.mem_bw == 3.35e12
    assert 138 <= h200.usable_mem_bytes / 2**30 <= 140
    assert h200.matmul_flops == 790e12 and h200.measured_mem_bw == 4.3e12
    c = cluster_spec("h200x32")
    assert c.intra_node_bw == 450e9 and c.inter_node_bw == 50e9


def test_sp_degrees_follow_the_world():
    assert cluster_spec("h200x32").sp_degrees() == [1, 2, 4, 8, 16, 32]
    assert cluster_spec("cpu").sp_degrees() == [1, 2, 4]
    three = dataclasses.replace(cluster_spec("h200x8"), num_nodes=3)
    assert three.sp_degrees() == [1, 2, 4, 8]  # 24 ranks: groups of 16 cannot tile them


def test_bad_specs_name_the_offence():
    with pytest.raises(ClusterError, match="unknown GPU 'a100'.*h200"):
        gpu_spec("a100")
    with pytest.raises(ClusterError, match="unknown cluster"):
        cluster_spec("h200x7")
    with pytest.raises(ConfigError, match="unknown model .*llama3_8b"):
        model_spec("gpt5")
    gpu = gpu_spec("h200")
    with pytest.raises(
        ClusterError, match="gpus_per_node=6 on 2 nodes; expected a power of two per node"
    ):
        ClusterSpec("odd", gpu, 2, 6, 1.0, 1.0, 0.0, 0.0)
    with pytest.raises(ClusterError, match=">= 1"):
        ClusterSpec("empty", gpu, 0, 8, 1.0, 1.0, 0.0, 0.0)
    assert isinstance(gpu, GPUSpec)


@pytest.mark.parametrize("name", MODELS)
def test_models_load(name):
    m = model_spec(name)
    assert m.hidden % m.heads == 0 and m.heads % m.kv_heads == 0


def test_llama_param_counts_match_published_sizes():
    # Published totals (Hugging Face model cards): exact for Llama.
    assert param_count(model_spec("llama3_8b")) == 8_030_261_248
    assert param_count(model_spec("llama2_7b")) == 6_738_415_616


def test_stdit_param_count_close_to_published():
    n = param_count(model_spec("stdit3_xl2"))
    assert 1.1e9 <= n <= 1.25e9
    pb = param_breakdown(model_spec("stdit3_xl2"))
    # 56 blocks of ~16 h^2 dominate.
    assert pb.layers == pytest.approx(56 * 16 * 1152**2, rel=0.01)


def test_llama_param_count_closed_form():
    m = model_spec("tiny_llama")
    h, f, V, L, kv = m.hidden, m.ffn_hidden, m.vocab, m.num_layers, m.kv_heads * m.head_dim
    per_layer = h * h + 2 * h * kv + h * h + 3 * h * f + 2 * h
    assert param_count(m) == V * h + L * per_layer + h + V * h
    tied = dataclasses.replace(m, tie_embeddings=True)
    assert param_count(tied) == param_count(m) - V * h


@pytest.mark.parametrize("name", ["tiny_llama", "tiny_stdit"])
def test_param_count_equals_the_runtime_module(name):
    torch = pytest.importorskip("torch")
    from dcp_bench.runtime.models import build_model

    spec = model_spec(name)
    module = build_model(spec)
    assert isinstance(module, torch.nn.Module)
    assert param_count(spec) == sum(p.numel() for p in module.parameters())
    # Same formula on a non-default shape (GQA ratio, depth, widths).
    if spec.arch == "llama":
        other = dataclasses.replace(
            spec, num_layers=3, heads=4, kv_heads=2, ffn_hidden=300, vocab=500
        )
    else:
        other = dataclasses.replace(
            spec, num_layers=3, hidden=64, heads=2, kv_heads=2, ffn_hidden=96, text_dim=40
        )
    assert param_count(other) == sum(p.numel() for p in build_model(other).parameters())
