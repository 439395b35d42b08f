"""Planners: a method turns a `GlobalBatch` into a `StepPlan`. Pure: no torch.distributed, no
GPU."""
