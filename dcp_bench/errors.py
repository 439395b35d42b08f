"""Error types. Every user-facing failure is a `DcpBenchError`: the CLI prints its message on one
line and exits with status 2, without a traceback."""

from __future__ import annotations


class DcpBenchError(Exception):
    """Base class for errors caused by bad input or an impossible request."""


class ConfigError(DcpBenchError):
    """Unknown config group value, bad override, malformed config."""


class WorkloadError(DcpBenchError):
    """Unknown workload, malformed lengths file, corrupt dataset record."""


class ClusterError(DcpBenchError):
    """An impossible cluster: world size that no group layout fits, unknown GPU."""


class PlanError(DcpBenchError):
    """A plan that breaks the plan invariants (raised by the validator)."""


class InfeasibleError(DcpBenchError):
    """A request no plan can satisfy, e.g. a sequence that fits no GPU at the largest SP degree."""


class OutputError(DcpBenchError):
    """An output place that cannot receive a file: a device, FIFO or folder where a file is
    wanted, a full disk, a read-only place. Nothing was half-written."""
