"""The real distributed runtime: models (`models`), packed attention kernels and sequence-parallel
exchanges (`attention`), the chunked LM loss (`lm_loss`), training states per ZeRO stage with
mixed precision (`training`), the process-group pool (`groups`), the plan executor
(`executor.TorchExecutor`), devices and measurement.

Everything here may import torch and torch.distributed; planners never import this package, and
it never imports a planner: the run path (`dcp_bench.run`) hands it a planning callable.
"""
