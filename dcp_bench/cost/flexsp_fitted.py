"""`flexsp_fitted`: FlexSP's own fitted cost model as a cost source.

FlexSP (Wang et al., ASPLOS'25) plans from a cost model fitted on its A100 testbed:
PKU-DAIR/Hetu-Galvatron, branch ``flexsp``, commit b4666892, ``galvatron/flexsp_solver/solver.py``
(cited below as ``solver.py:LINE``), class ``flexSPCostModel`` (solver.py:13-99):

- compute of a group of SP degree ``sp`` holding sequences ``L_i`` (ms):
  ``sum_i (a1 L_i^2 + a2 L_i) / sp + b`` (solver.py:73-80), the bias ``b`` once per group;
- all-to-all (ms): ``4 * 2 * layers * hidden * sum_i L_i * 2 / 2^20 / sp`` MiB over a measured
  bandwidth per SP degree, none at SP 1 (solver.py:85-93); the bandwidths the driver passes are
  solver.py:1105 ("4k seq, 2 IB");
- memory (MiB per GPU): model states ``P * 16 * zero_ratio * 1024`` (ZeRO-3: ``1/N``,
  solver.py:36-42) plus ``act_per_token * sum_i L_i / sp`` (solver.py:58-64); the memory limit
  is the driver's ``--memory_limit_gb`` (solver_all.sh: 30), no other overhead.

The per-model constants are ``optimizer_param_dict`` (solver.py:1060-1088); the parameter size
the driver uses for a max length of 192K or 384K is ``param_size_B[seq_limit_k]``, interpolated
linearly in between (solver.py:1107-1112). The model has no gradient-sync or optimizer term: the
driver's iteration time is the sum of the micro-batches' slowest group (solver.py:1242), so
`step_sync_time` is 0. Its fit does not separate forward from backward or recomputation: the
whole compute time is booked as ``fwd_s``.

These are the authors' constants, used as they give them: nothing here is fitted to FlexSP's
published speedups or to anything else.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from dcp_bench.cost.base import CostModel, MicroBatchCost
from dcp_bench.errors import ConfigError

MIB = float(2**20)
REPO = "PKU-DAIR/Hetu-Galvatron@b4666892 galvatron/flexsp_solver/solver.py"


@dataclass(frozen=True)
class FlexSPModelConstants:
    """One model's row of ``optimizer_param_dict`` (solver.py:1060-1088)."""

    act_per_token_mib: float
    cpt_alpha1: float  # ms per token^2
    cpt_alpha2: float  # ms per token
    cpt_beta1: float  # ms per group
    hidden: int
    layers: int
    param_size_b: dict[int, float]  # max length (K tokens) -> billions of parameters
    line: str

    def param_size(self, seq_limit_k: int) -> float:
        """The parameter size the driver uses for ``seq_limit_k`` (solver.py:1107-1112)."""
        p = self.param_size_b
        if seq_limit_k in p:
            return p[seq_limit_k]
        return (p[384] - p[192]) / 192 * (seq_limit_k - 192) + p[192]


# optimizer_param_dict, solver.py:1060-1088 (gpt-7b 1061-1069, gpt-13b 1070-1078, gpt-30b 1079-1087)
FLEXSP_MODELS: dict[str, FlexSPModelConstants] = {
    "gpt_7b": FlexSPModelConstants(
        4.480441895, 5.128e-6, 183.9576e-3, 629.3563, 4096, 32,
        {4: 6.51, 192: 7.1174468994140625, 384: 7.8498687744140625}, "solver.py:1061-1069",
    ),
    "gpt_13b": FlexSPModelConstants(
        4.220439453, 9.2852e-6, 306.0189e-3, 1132.5632, 5120, 40,
        {4: 12.3568, 192: 13.11605453491211, 384: 14.03158187866211}, "solver.py:1070-1078",
    ),
    "gpt_30b": FlexSPModelConstants(
        3.417381836, 15.4262e-6, 803.5742e-3, 2789.3644, 6656, 60,
        {4: 30.538, 192: 31.52513885498047, 384: 32.71532440185547}, "solver.py:1079-1087",
    ),
}  # fmt: skip
# All-to-all "bandwidth" (MiB/ms) per SP degree as the driver passes it (solver.py:1105).
FLEXSP_A2A_BW: dict[int, float] = {
    1: 1e10, 2: 119.54, 4: 104.07, 8: 96.5, 16: 10.33, 32: 5.94, 64: 4.87,
}  # fmt: skip


def flexsp_constants_for(model_name: str, flexsp_model: str | None) -> FlexSPModelConstants:
    """The constants of ``flexsp_model`` (or of ``model_name`` when it is one of FlexSP's)."""
    key = flexsp_model or model_name
    if key not in FLEXSP_MODELS:
        raise ConfigError(
            f"cost source 'flexsp_fitted' has no constants for model {key!r}; expected one of "
            f"{', '.join(FLEXSP_MODELS)} (pass ++cost.flexsp_model=NAME to price a stand-in)"
        )
    return FLEXSP_MODELS[key]


@dataclass
class FlexSPFittedCostModel(CostModel):
    """FlexSP's fitted cost model (module docstring) behind the `CostModel` interface.

    Args (besides `CostModel`'s): ``flexsp_model`` (gpt_7b, gpt_13b, gpt_30b; default the
    model's own name), ``seq_limit_k`` (the max length in K tokens, which picks the parameter
    size, solver.py:1107-1112), ``memory_limit_gb`` (the driver's memory limit, solver_all.sh:
    30; replaces ``mem_cap_fraction``). ``ckpt_layers`` is accepted and not priced: FlexSP's fit
    was measured with one recomputation setting and does not vary it.
    """

    flexsp_model: str | None = None
    seq_limit_k: int = 192
    memory_limit_gb: float = 30.0
    source: str = "flexsp_fitted"

    def __post_init__(self) -> None:
        if self.seq_limit_k <= 0:
            raise ConfigError(f"seq_limit_k={self.seq_limit_k}; expected a positive number (K)")
        if self.memory_limit_gb <= 0:
            raise ConfigError(f"memory_limit_gb={self.memory_limit_gb}; expected > 0")
        self.consts = flexsp_constants_for(self.model.name, self.flexsp_model)
        W = self.cluster.world_size
        missing = [d for d in self.sp_degrees() if d not in FLEXSP_A2A_BW]
        if missing:
            raise ConfigError(
                f"cost source 'flexsp_fitted': no measured all-to-all bandwidth for SP degrees "
                f"{missing} on {W} GPUs; FlexSP's table covers {sorted(FLEXSP_A2A_BW)}"
            )
        # ZeRO-3, mixed precision: 16 bytes a parameter sharded over the world (solver.py:36-42)
        self.model_states_mib = self.consts.param_size(self.seq_limit_k) * 16 / W * 1024
        self.provenance = {
            **self.provenance,
            "fitted_by": f"FlexSP authors: {REPO}, flexSPCostModel (13-99)",
            "constants": self.consts.line,
            "a2a_bandwidth": "solver.py:1105",
            "seq_limit_k": self.seq_limit_k,
            "memory_limit_gb": self.memory_limit_gb,
        }

    @property
    def memory_cap_bytes(self) -> float:
        return self.memory_limit_gb * 1024 * MIB

    def sp_degrees(self) -> list[int]:
        """Every power of two up to the world: FlexSP's options are not limited by heads
        (solver.py:283-300)."""
        return self.cluster.sp_degrees()

    def describe_sp_degrees(self) -> str:
        return f"{', '.join(map(str, self.sp_degrees()))} (powers of two dividing the world)"

    # -- FlexSP's formulas, in seconds -------------------------------------------------------
    def _share_s(self, tokens: np.ndarray, sp: int) -> np.ndarray:
        """compute_time_single + alltoall_time of each sequence (solver.py:73-74, 85-96)."""
        L = np.asarray(tokens, dtype=np.float64)
        c = self.consts
        compute = (c.cpt_alpha1 * L**2 + c.cpt_alpha2 * L) / sp
        return (compute + self._a2a_ms(L, sp)) / 1e3

    def _a2a_ms(self, tokens: np.ndarray, sp: int) -> np.ndarray:
        if sp == 1:
            return np.zeros_like(tokens, dtype=np.float64)
        c = self.consts
        mib = 4 * 2 * c.layers * c.hidden * np.asarray(tokens, np.float64) * 2 / MIB / sp
        return mib / FLEXSP_A2A_BW[sp]

    def microbatch_cost(
        self,
        tokens: np.ndarray,
        frames: np.ndarray,
        sp: int,
        ckpt_layers: int,
        split: str = "sequence",
    ) -> MicroBatchCost:
        if split != "sequence":
            raise ConfigError(
                f"cost source 'flexsp_fitted' prices sequence-split micro-batches only; got "
                f"split={split!r}"
            )
        L = np.asarray(tokens, dtype=np.float64)
        c = self.consts
        compute_ms = float(((c.cpt_alpha1 * L**2 + c.cpt_alpha2 * L) / sp).sum()) + c.cpt_beta1
        a2a_ms = float(self._a2a_ms(np.asarray([L.sum()]), sp)[0])
        mem = self.static_memory_bytes() + float(self.sample_memory(tokens, frames, sp, 0).sum())
        return MicroBatchCost(
            fwd_s=compute_ms / 1e3,
            bwd_s=0.0,
            recompute_s=0.0,
            comm_s=a2a_ms / 1e3,
            mem_bytes=mem,
            model_flops=0.0,  # the fit prices time only
        )

    def sample_time(
        self, tokens: np.ndarray, frames: np.ndarray, sp: int, ckpt_layers: int
    ) -> np.ndarray:
        return self._share_s(tokens, sp) + self.consts.cpt_beta1 / 1e3

    def sample_time_packed(
        self, tokens: np.ndarray, frames: np.ndarray, sp: int, ckpt_layers: int
    ) -> np.ndarray:
        return self._share_s(tokens, sp)

    def microbatch_overhead(self, sp: int, ckpt_layers: int) -> float:
        return self.consts.cpt_beta1 / 1e3

    def sample_memory(
        self, tokens: np.ndarray, frames: np.ndarray, sp: int, ckpt_layers: int
    ) -> np.ndarray:
        return self.consts.act_per_token_mib * np.asarray(tokens, np.float64) / sp * MIB

    def static_memory_bytes(self) -> float:
        return self.model_states_mib * MIB

    def step_sync_time(self) -> float:
        return 0.0

    def describe(self) -> dict[str, Any]:
        return {**super().describe(), "flexsp_model": self.flexsp_model or self.model.name}
