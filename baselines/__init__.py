"""The static and peer systems DCP is measured against, each a `Planner` producing `StepPlan`s.

One module per reproduced system (see baselines/README.md for sources and deviations):
bucket_static, static_tuned, packed_static, megatron_hybrid_cp, flexsp_milp, wlb_llm.
Shared building blocks live in `baselines.scheduling`. Pure numpy / HiGHS: no torch.
"""
