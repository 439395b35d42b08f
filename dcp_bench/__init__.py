"""dcp-bench: benchmark and reproducibility suite for Data-Centric Parallel training."""

__version__ = "0.1.0"
