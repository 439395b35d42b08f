"""The analytical cost model's uncertain constants by name, and the assumptions they default to
when no GPU or cluster config calibrates them (`dcp_bench.cost.analytical` explains each one;
the configs' ``cost_constants`` may set any of these keys)."""

from __future__ import annotations

# The uncertain constants and the assumptions they default to when no config calibrates them
# (each explained at its field of AnalyticalCostModel and in docs/cost_model.md).
ASSUMED_CONSTANTS: dict[str, float] = {
    "gemm_half_tokens": 1024.0,
    "attn_eff_max": 0.45,
    "attn_half_len": 512.0,
    "attn_bwd_factor": 2.0,
    "a2a_eff": 0.7,
    "allreduce_eff": 0.8,
    "elementwise_bytes_factor": 2.0,
}
# Constants a config may set that have no built-in value: None means "derived" (a2a_latency_s and
# allreduce_hop_latency_s: the cluster's intra_node_latency_s; allreduce_inter_eff: allreduce_eff;
# gemm_half_flops: unset, gemm_half_tokens applies; attn_causal_half_len: attn_half_len) or no
# extra term (allreduce_overlap: phases serialised).
OPTIONAL_CONSTANTS = (
    "gemm_half_flops",
    "attn_causal_half_len",
    "a2a_latency_s",
    "allreduce_hop_latency_s",
    "allreduce_inter_eff",
    "allreduce_overlap",
)

# Cost-model options (``++cost.KEY=VALUE``) that vary a model term for the report's sensitivity:
# recorded with a run's scales, so a variant's runs form their own cells.
MODEL_VARIANT_OPTIONS = ("layer_launch_s", "allocator_fragmentation")

__all__ = ["ASSUMED_CONSTANTS", "MODEL_VARIANT_OPTIONS", "OPTIONAL_CONSTANTS"]

# Adam step traffic per parameter, bytes: read+write fp32 master (8), two fp32 moments (16), read
# the gradient (2-4) and write the bf16 copy (2): ~30; rounded up to 32 for the non-fused tail.
ADAM_BYTES_PER_PARAM = 32.0
