"""The real distributed runtime: models, sequence-parallel attention, the process-group pool, the
plan executor (`TorchExecutor`), devices and measurement.

Everything here may import torch and torch.distributed; planners never import this package, and
it never imports a planner: the run path (`dcp_bench.run`) hands it a planning callable.
"""
