"""The real distributed runtime: models, sequence-parallel attention, the process-group pool, the
plan executor, measurement and the torchrun launcher.

Everything here may import torch and torch.distributed; planners never import this package.
"""
