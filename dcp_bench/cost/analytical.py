"""The analytical cost and memory model: exact FLOP counts, byte counts, link bandwidths and
saturating efficiency curves. Every constant is a field with its default's source or assumption;
docs/cost_model.md derives each formula.

Time of a sequence-split micro-batch on an SP group of ``s`` ranks, per rank:

- forward = GEMM FLOPs / (s * peak * eff_gemm(tokens per rank))
  + sum over samples and attention kinds of attention FLOPs / (s * peak * eff_attn(length))
  (STDiT3 self-attention on the reference's path for its length: none for length 1, the
  memory-bound math path under 30 keys, `AnalyticalCostModel.self_attention_work`)
  + memory-bound kernels: tokens per rank x layers x bytes moved per token / memory bandwidth;
- backward = 2 x the forward's GEMMs and memory-bound kernels (weight- and input-gradient GEMMs)
  + ``attn_bwd_factor`` x the forward's attention time (flash attention's backward);
- recompute = the forward of the ``ckpt_layers`` checkpointed layers (embedding / head excluded);
- communication = per layer and direction 2 all-to-alls (Ulysses: fused q/k/v, then the output;
  DSP: the spatial->temporal and temporal->spatial switches), each priced
  ``latency + bytes * (s-1)/s / (bandwidth * a2a efficiency)`` with the inter-node link when the
  aligned group spans nodes; paid forward, backward and again for each recomputed layer;
- ring attention (a micro-batch's ``ulysses`` part smaller than its group: ring or hybrid SP,
  `ring_attention_times`): per layer ``r - 1`` point-to-point steps of the K/V block
  (``r`` = group / Ulysses part), each overlapped with one step of attention compute, so a pass
  takes ``(r-1) max(compute/r, step) + compute/r`` (backward: the K/V and their gradients travel,
  and the gradients' last hop home is not hidden); only what is not hidden is charged to
  communication. A hybrid's Ulysses part adds its all-to-alls over its sub-group.

Model FLOPs are 3 x the forward FLOPs and exclude recomputation (the MLPerf rule for MFU).

The uncertain constants (`ASSUMED_CONSTANTS`) are resolved once per model, in this order: a value
passed to the constructor; the cluster config's ``cost_constants``; the GPU config's
``cost_constants``; the built-in assumption. The H100/H200 configs carry values calibrated
against published measurements (``dcp-bench validate``, ``results/validation/``), each with its
source; ``describe()["constant_sources"]`` says where every value came from.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass, field
from typing import ClassVar

import numpy as np

from dcp_bench.archs import arch_of
from dcp_bench.config import MEM_CAP_FRACTION
from dcp_bench.cost import megatron
from dcp_bench.cost.activations import FUSED_ATTENTION_MIN_LEN, activation_terms
from dcp_bench.cost.base import (
    MICROBATCH_TIME_TERMS,
    STEP_TIME_TERMS,
    SYNC_PART,
    CostModel,
    MicroBatchCost,
    TimeTerm,
    deal_by_tokens,
)
from dcp_bench.cost.constants import ADAM_BYTES_PER_PARAM, ASSUMED_CONSTANTS, OPTIONAL_CONSTANTS
from dcp_bench.cost.params import param_breakdown
from dcp_bench.cost.reference_loop import (
    ATTN_BWD_TENSORS,
    ATTN_FWD_TENSORS,
    EMA_BYTES_PER_ELEMENT,
    HOST_TO_DEVICE_BW,
    LOOPS,
    OP_DISPATCH_S,
    SHORT_ATTENTION_KEYS,
    ema_param_tensors,
    host_input_bytes,
)
from dcp_bench.errors import ConfigError
from dcp_bench.layout import ModelParallel, ulysses_span
from dcp_bench.train_policy import (
    DEFAULT_ZERO_STAGE,
    LOGITS_CHUNK_TOKENS,
    check_zero_stage,
    fsdp_pass_bytes,
    grad_sync_bytes,
    logits_chunk_bytes,
    precision_policy,
    static_state_bytes,
)

# The sensitivity multipliers of the uncertain constants (`AnalyticalCostModel.scales`) and their
# defaults: the one place both are defined. `cost.scales` in conf/config.yaml lists them, and the
# run spec validates against them (`dcp_bench.run.spec`).
SCALE_DEFAULTS: dict[str, float] = {
    "act_bytes": 1.0,
    "attn_eff": 1.0,
    "small_kernel_eff": 1.0,
    "a2a_eff": 1.0,
    "elementwise": 1.0,
}
SCALE_KEYS = tuple(SCALE_DEFAULTS)


@dataclass
class AnalyticalCostModel(CostModel):
    """Cost model from first principles. See the module docstring and docs/cost_model.md."""

    prices_ring: ClassVar[bool] = True
    bounds_ring: ClassVar[bool] = True

    source: str = "analytical"
    # The micro-batch terms beyond the model's own work (`dcp_bench.cost.reference_loop`): the
    # memory-traffic floor of short attention (always), the reference loop's input copy.
    time_terms: ClassVar[tuple[TimeTerm, ...]] = (
        *MICROBATCH_TIME_TERMS,
        TimeTerm("short_attn_s", "short_attn_s", "short attention, memory-traffic floor"),
        TimeTerm("host_input_s", "host_input_s", "input copy to the GPU (the reference's loop)"),
    )
    # Once per step: the reference loop's EMA update and loss all-reduce beside the sync.
    step_terms: ClassVar[tuple[TimeTerm, ...]] = (
        *STEP_TIME_TERMS,
        TimeTerm("ema_s", SYNC_PART, "gradient sync + optimizer step"),
        TimeTerm("loss_sync_s", SYNC_PART, "gradient sync + optimizer step", communication=True),
    )
    # Whose training loop is priced: "runtime" (this suite's) or "reference" (VideoSys's
    # `train.py`: EMA, loss all-reduce, the dummy dataset's input copy; paper mode sets it).
    loop: str = "runtime"
    # Host cost of one eager op and its launch, for the EMA's per-tensor kernels (assumption).
    op_dispatch_s: float = OP_DISPATCH_S
    # Price attention over fewer than 512 keys at least at its memory traffic (`short_attn_s`).
    short_attention_floor: bool = True
    # Multipliers on the uncertain constants, for sensitivity studies (keys in SCALE_KEYS).
    scales: dict[str, float] = field(default_factory=dict)
    # ZeRO stage over the data-parallel world (all W ranks hold a model replica: SP shards
    # activations, not weights). 1 = optimizer states sharded, the DeepSpeed / Open-Sora default.
    zero_stage: int = DEFAULT_ZERO_STAGE
    # GEMM efficiency ceiling; None = gpu.matmul_flops / gpu.peak_flops (a measured large GEMM).
    gemm_eff_max: float | None = None
    # The constants below are None until resolved (see the module docstring); the assumptions
    # they fall back to are in ASSUMED_CONSTANTS.
    # Tokens per rank at which GEMM efficiency is half its ceiling. Assumption 1,024 (hidden-4096
    # bf16 GEMMs on Hopper need a few thousand rows to fill 132 SMs with 128x256 tiles).
    gemm_half_tokens: float | None = None
    # FLOPs of one GEMM at which its efficiency is half the ceiling; when set it replaces
    # gemm_half_tokens: a model whose layer GEMMs do w multiply-adds per token each (the mean over
    # the layer's GEMMs) reaches half the ceiling at gemm_half_flops / (2 w) tokens per rank, so a
    # narrow model (STDiT3, hidden 1152) needs ~12x more tokens than a wide one (Llama 3 8B).
    # Equivalently every GEMM call costs gemm_half_flops / (ceiling x peak) seconds on top of its
    # FLOPs. Calibrated on published GEMM timings over many shapes (results/validation/).
    gemm_half_flops: float | None = None
    # Flash-attention efficiency ceiling (share of dense peak). Assumption 0.45, between
    # FlashAttention-2 on H100 (~35-40%) and FlashAttention-3 (~60-75% forward).
    attn_eff_max: float | None = None
    # Attention length at which attention efficiency is half its ceiling (short temporal attention
    # over a few frames is latency-bound). Assumption 512.
    attn_half_len: float | None = None
    # The same for causal attention (half-empty diagonal tiles cost more at short lengths);
    # None = attn_half_len.
    attn_causal_half_len: float | None = None
    # Attention backward time / attention forward time. Assumption 2 (backward FLOPs are 2.5x
    # forward FLOPs in flash attention's own count, at a somewhat higher rate).
    attn_bwd_factor: float | None = None
    # Share of link bandwidth an all-to-all reaches (NCCL all-to-all on NVLink and IB).
    # Assumption 0.7.
    a2a_eff: float | None = None
    # Fixed cost of one all-to-all inside a node (s); None = the cluster's intra_node_latency_s.
    a2a_latency_s: float | None = None
    # Share of bus bandwidth a large ring all-reduce / reduce-scatter reaches. Assumption 0.8
    # (NCCL tests reach ~80% of NVLink and IB line rate at 1 GB messages).
    allreduce_eff: float | None = None
    # The same across nodes (network instead of NVLink); None = allreduce_eff.
    allreduce_inter_eff: float | None = None
    # Latency of one ring step of an all-reduce inside a node (s); None = intra_node_latency_s.
    allreduce_hop_latency_s: float | None = None
    # Share of the shorter of the intra-node and inter-node all-reduce phases hidden under the
    # longer one (NCCL pipelines them); None = 0, the phases serialised.
    allreduce_overlap: float | None = None
    # Memory-bound kernels (norms, RoPE, activations, residual adds, modulation) move this many
    # bytes per byte of activation a layer saves, at the GPU's measured memory bandwidth.
    # Assumption 2: each saved tensor is written once and read about once more in the forward.
    elementwise_bytes_factor: float | None = None
    # False: ignore the configs' calibrated constants (the built-in assumptions, for comparison).
    use_config_constants: bool = True
    # A fixed floor per transformer block and pass (forward, backward, each recomputation) of every
    # micro-batch: kernel launches and Python dispatch that no FLOP or byte count sees (s).
    # Default 0: the calibrated GEMM law already charges a fixed ~8 us per GEMM call
    # (gemm_half_flops, fitted on published timings, results/validation/); a floor on top of it
    # is not in that calibration, so the report varies it (0.1, 0.3, 1 ms) as model uncertainty.
    layer_launch_s: float = 0.0
    # The caching allocator's share on top of the activation bytes (fragmentation: blocks split
    # and cached across differently sized micro-batches), a separate memory term: sample_memory and
    # mem_bytes charge activation x (1 + this). Default 0: the GPU configs' fixed workspace_bytes
    # (3 GiB: CUDA context ~0.5 GiB, NCCL buffers ~1 GiB, fragmentation; an assumption, see
    # conf/gpu/*.yaml) is the allocator's whole allowance until a GPU measurement calibrates
    # it; the report varies it (0.05, 0.1, 0.2) as model uncertainty. PyTorch's caching allocator
    # rounds blocks to 512 B and carves them from 2 MiB / 20 MiB segments (docs: "CUDA semantics,
    # memory management"), so large activations waste little to rounding; fragmentation across
    # micro-batches of changing shapes is what this share stands for.
    allocator_fragmentation: float = 0.0
    # The LM loss is computed in chunks of this many tokens per rank, so at most one chunk of fp32
    # logits lives at a time (chunked / vocab-parallel cross-entropy, as long-context trainers do).
    logits_chunk_tokens: int = LOGITS_CHUNK_TOKENS
    # Megatron-style tensor and pipeline parallelism (`with_model_parallel`,
    # `dcp_bench.cost.megatron`); None: every rank holds the whole model.
    model_parallel: ModelParallel | None = None

    def __post_init__(self) -> None:
        unknown = set(self.scales) - set(SCALE_KEYS)
        if unknown:
            raise ConfigError(
                f"unknown cost scale(s) {sorted(unknown)}; expected keys {list(SCALE_KEYS)}"
            )
        for key, val in self.scales.items():
            if not val > 0:
                raise ConfigError(f"cost scale {key}={val}: must be > 0")
        check_zero_stage(self.zero_stage)
        if self.loop not in LOOPS:
            raise ConfigError(f"cost loop={self.loop!r}; expected one of {', '.join(LOOPS)}")
        if not self.op_dispatch_s >= 0:
            raise ConfigError(f"op_dispatch_s={self.op_dispatch_s}: expected a value >= 0")
        if not (self.layer_launch_s >= 0 and self.allocator_fragmentation >= 0):
            raise ConfigError(
                f"layer_launch_s={self.layer_launch_s}, allocator_fragmentation="
                f"{self.allocator_fragmentation}: expected values >= 0"
            )
        MEM_CAP_FRACTION.check(self.mem_cap_fraction)
        constant_sources = self._resolve_constants()
        self._derive()
        self.provenance = {
            **self.provenance,
            "constants": {
                "gemm_eff_max": self._gemm_max,
                **{k: getattr(self, k) for k in (*ASSUMED_CONSTANTS, *OPTIONAL_CONSTANTS)},
                "zero_stage": self.zero_stage,
                "logits_chunk_tokens": self.logits_chunk_tokens,
                "workspace_bytes": self.cluster.gpu.workspace_bytes,
                "layer_launch_s": self.layer_launch_s,
                "allocator_fragmentation": self.allocator_fragmentation,
            },
            "memory_terms": {
                "activations": (
                    "counted from the runtime's models (dcp_bench.cost.activations; dcp-bench "
                    "memory)"
                ),
                "allocator": (
                    "workspace_bytes (GPU config: CUDA context, NCCL buffers, workspace; "
                    "assumption) + allocator_fragmentation x activations"
                ),
            },
            "constant_sources": constant_sources,
            "scales": {k: self._scale(k) for k in SCALE_KEYS},
            "gpu": self.cluster.gpu.name,
            "gpu_sources": dict(self.cluster.gpu.sources),
            "cluster_sources": dict(self.cluster.sources),
        }

    # ----------------------------------------------------------------------------------- setup
    def _resolve_constants(self) -> dict[str, str]:
        """Fill every constant left None (module docstring order) and say where each came from."""
        c, g = self.cluster, self.cluster.gpu
        sources: dict[str, str] = {}
        for key in (*ASSUMED_CONSTANTS, *OPTIONAL_CONSTANTS):
            if getattr(self, key) is not None:
                sources[key] = "passed to the cost model"
                continue
            value, where = ASSUMED_CONSTANTS.get(key), "assumption (built-in default)"
            if key in ("a2a_latency_s", "allreduce_hop_latency_s"):
                value, where = c.intra_node_latency_s, f"cluster {c.name}: intra_node_latency_s"
            if self.use_config_constants:
                for owner, consts, srcs in (
                    (f"cluster {c.name}", c.cost_constants, c.sources),
                    (f"gpu {g.name}", g.cost_constants, g.sources),
                ):
                    if key in consts:
                        value = float(consts[key])
                        where = (
                            f"{owner}: {srcs.get(key) or srcs.get('cost_constants') or 'config'}"
                        )
                        break
            setattr(self, key, None if value is None else float(value))
            sources[key] = where
        for key in ASSUMED_CONSTANTS:
            if not float(getattr(self, key)) >= 0:
                raise ConfigError(f"cost constant {key}={getattr(self, key)}: must be >= 0")
        return sources

    def _scale(self, key: str) -> float:
        return float(self.scales.get(key, SCALE_DEFAULTS[key]))

    def _derive(self) -> None:
        """Per-token and per-sample constants of the model (FLOPs, bytes), computed once."""
        m, gpu = self.model, self.cluster.gpu
        self._arch = arch_of(m)
        L = m.num_layers
        b = m.dtype_bytes
        self._L = L
        self._b = b
        self._peak = gpu.peak_flops
        self._gemm_max = (
            self.gemm_eff_max
            if self.gemm_eff_max is not None
            else gpu.matmul_flops / gpu.peak_flops
        )
        ske = self._scale("small_kernel_eff")
        assert self.gemm_half_tokens is not None and self.attn_half_len is not None
        assert self.attn_eff_max is not None and self.a2a_eff is not None
        self._gemm_half_flops = None if self.gemm_half_flops is None else self.gemm_half_flops / ske
        self._attn_half = self.attn_half_len / ske
        self._attn_causal_half = (
            self.attn_half_len if self.attn_causal_half_len is None else self.attn_causal_half_len
        ) / ske
        self._attn_max = min(1.0, self.attn_eff_max * self._scale("attn_eff"))
        self._a2a = self.a2a_eff * self._scale("a2a_eff")
        self._attn_bwd = float(self.attn_bwd_factor or 0.0)
        self._allreduce = float(self.allreduce_eff or 0.0)
        self._ar_overlap = float(self.allreduce_overlap or 0.0)
        self._ar_inter = (
            self._allreduce if self.allreduce_inter_eff is None else float(self.allreduce_inter_eff)
        )
        self._ar_hop = float(
            self.allreduce_hop_latency_s
            if self.allreduce_hop_latency_s is not None
            else self.cluster.intra_node_latency_s
        )
        gt = self._arch.gemm_terms(m, b)
        self._layer_gemm_tok = gt.layer_tok
        self._layer_gemm_sample = gt.layer_sample
        self._head_gemm_tok = gt.head_tok
        self._head_gemm_sample = gt.head_sample
        # The memory charged is `activation_terms` (what the models keep, counted).
        self._act_full_tok = gt.act_full_tok
        self._gemms_per_layer = gt.gemms_per_layer
        # Mean multiply-adds per token of one layer GEMM (cross-attention k/v act on captions)
        # (elementwise FLOPs such as the STDiT pair's 12h adaLN modulation are not GEMMs)
        macs = (self._layer_gemm_tok - gt.elementwise_flops_tok) / 2.0 / self._gemms_per_layer
        self.gemm_macs_per_token = macs
        if self._gemm_half_flops is not None:
            self._gemm_half = self._gemm_half_flops / (2.0 * macs)
        else:
            self._gemm_half = float(self.gemm_half_tokens) / ske
        # What the runtime's models keep for the backward, unit by unit (activation_bytes).
        self._act_terms = activation_terms(m)
        # Seconds per token per layer of memory-bound kernels on one rank.
        self._elem_tok_s = (
            float(self.elementwise_bytes_factor or 0.0)
            * self._scale("elementwise")
            * self._act_full_tok
            / gpu.measured_mem_bw
        )
        pb = param_breakdown(m)
        self._params = pb.total
        self._layer_params = pb.per_layer

    # ------------------------------------------------------------------------------- pieces
    def gemm_efficiency(self, tokens_per_rank: np.ndarray | float) -> np.ndarray:
        """Share of peak a rank's GEMMs reach on ``tokens_per_rank`` tokens (saturating curve)."""
        x = np.asarray(tokens_per_rank, dtype=float)
        return self._gemm_max * x / (x + self._gemm_half)

    def gemm_efficiency_flops(self, flops: np.ndarray | float) -> np.ndarray:
        """Share of peak one GEMM of ``flops`` reaches (the calibrated per-GEMM law; with only
        gemm_half_tokens set, that half point in a hidden-size-wide GEMM of this model)."""
        f = np.asarray(flops, dtype=float)
        half = (
            self._gemm_half_flops
            if self._gemm_half_flops is not None
            else self._gemm_half * 2.0 * self.gemm_macs_per_token
        )
        return self._gemm_max * f / (f + half)

    def attention_efficiency(self, length: np.ndarray | float, causal: bool = False) -> np.ndarray:
        """Share of peak flash attention reaches on sequences of ``length`` keys (``causal``:
        with a causal mask, FLOPs counted over the causal half)."""
        x = np.asarray(length, dtype=float)
        return self._attn_max * x / (x + (self._attn_causal_half if causal else self._attn_half))

    def sample_flops(self, tokens: np.ndarray, frames: np.ndarray) -> dict[str, np.ndarray]:
        """Forward FLOPs of each sample, by part: ``layer_gemm``, ``head_gemm``, ``attn`` (all
        layers) and ``attn_work`` (attention FLOPs divided by their efficiency, i.e. FLOPs at
        peak-equivalent: time = attn_work / (s * peak))."""
        n = np.asarray(tokens, dtype=float)
        L, m = self._L, self.model
        layer_gemm = L * (n * self._layer_gemm_tok + self._layer_gemm_sample)
        head_gemm = n * self._head_gemm_tok + self._head_gemm_sample
        attn, work = self._arch.attention_flops(m, n, frames, self)
        return {"layer_gemm": layer_gemm, "head_gemm": head_gemm, "attn": attn, "attn_work": work}

    def self_attention_work(
        self, flops: np.ndarray, length: np.ndarray, rows: np.ndarray
    ) -> np.ndarray:
        """Peak-equivalent FLOPs (time x peak) of one STDiT block's self-attention over ``rows``
        rows in sequences of ``length`` keys, on the reference's path for that length
        (`dcp_bench.cost.activations.FUSED_ATTENTION_MIN_LEN`; VideoSys
        ``videosys/models/modules/attentions.py:57-66``): length 1 is free (v is the output);
        the fused kernel at its efficiency; under the threshold the unfused math path, priced
        memory-bound at the measured bandwidth: the l x l scores materialised in HBM (q k^T
        writes them in the compute dtype, the fp32 cast, the softmax, the cast back and
        scores x v read and write them: ``(4b + 12) H l`` bytes per row) plus the passes the
        fused kernel does not make (the q scaling, the contiguous k and v copies the batched
        matmuls take: read and write each, ``6bh`` per row); never faster than its FLOPs at the
        fused kernel's ceiling."""
        ln = np.asarray(length, dtype=float)
        m, b = self.model, self._b
        fused = flops / self.attention_efficiency(np.maximum(ln, 1.0))
        nbytes = np.asarray(rows, dtype=float) * (
            6.0 * b * m.hidden + (4.0 * b + 12.0) * m.heads * ln
        )
        math = np.maximum(
            flops / self._attn_max, nbytes / self.cluster.gpu.measured_mem_bw * self._peak
        )
        return np.where(ln <= 1, 0.0, np.where(ln < FUSED_ATTENTION_MIN_LEN, math, fused))

    def a2a_bytes_per_layer(self, tokens_per_rank: np.ndarray, sp: np.ndarray) -> np.ndarray:
        """Bytes each rank holds in the all-to-alls of one layer's forward (before the (s-1)/s
        share that leaves the rank)."""
        n_r = np.asarray(tokens_per_rank, dtype=float)
        return self._arch.a2a_bytes_per_layer(self.model, n_r, sp, self._b)

    def a2a_time(self, nbytes: np.ndarray, sp: np.ndarray, collectives: int) -> np.ndarray:
        """Time of ``collectives`` all-to-alls moving ``nbytes`` held per rank in total."""
        s = np.asarray(sp, dtype=float)
        c = self.cluster
        spans = s > c.gpus_per_node
        bw = np.where(spans, c.inter_node_bw, c.intra_node_bw) * self._a2a
        lat = np.where(spans, c.inter_node_latency_s, float(self.a2a_latency_s or 0.0))
        t = collectives * lat + np.asarray(nbytes) * (s - 1) / s / bw
        return np.where(s > 1, t, 0.0)

    def ring_step_bytes(self, tokens_per_ring_rank: np.ndarray, ulysses: np.ndarray) -> np.ndarray:
        """Bytes of one ring step of one layer's forward: the K/V block a ring rank holds (its
        share of every sample, ``tokens_per_ring_rank``) with the KV heads of its Ulysses slice
        (all KV heads for pure ring; a hybrid's Ulysses part of ``u`` ranks holds
        max(KV, u) / u of them, as `a2a_bytes_per_layer` repeats them)."""
        m = self.model
        u = np.asarray(ulysses, dtype=float)
        kv = np.maximum(m.kv_heads, u) / u * m.head_dim
        return np.asarray(tokens_per_ring_rank, dtype=float) * self._b * 2 * kv

    def p2p_time(self, nbytes: np.ndarray, spans_nodes: np.ndarray) -> np.ndarray:
        """One point-to-point send of ``nbytes`` to the next ring rank (inter-node link and
        latency when the ring crosses nodes: the ring waits for its slowest hop), at the
        all-to-all's link efficiency (``a2a_eff``: the same links; an assumption)."""
        c = self.cluster
        bw = np.where(spans_nodes, c.inter_node_bw, c.intra_node_bw) * self._a2a
        lat = np.where(spans_nodes, c.inter_node_latency_s, float(self.a2a_latency_s or 0.0))
        return lat + np.asarray(nbytes, dtype=float) / bw

    def ring_attention_times(
        self, attn_fwd_s: np.ndarray, step_s: np.ndarray, ring: np.ndarray
    ) -> tuple[np.ndarray, np.ndarray]:
        """(forward, backward) time of one layer's ring attention on a ring of ``ring`` ranks:
        ``attn_fwd_s`` the layer's attention compute per rank (the backward's is
        ``attn_bwd_factor`` times it), ``step_s`` one K/V transfer (`p2p_time`).

        The causal load-balanced split (2 r chunks, rank i holds i and 2r-1-i) gives every step
        the same compute: the diagonal step attends 2c causal queries to 2c keys, every other
        step 2c to c (or c to 2c) in full, 2c^2 pairs each. Step j's transfer (the block of step
        j+1) runs under step j's compute: forward ``(r-1) max(A/r, C) + A/r``; backward the K/V
        and their gradients travel (2 C per step) and the gradients' last hop home is exposed:
        ``(r-1) max(B/r, 2C) + B/r + C``."""
        r = np.asarray(ring, dtype=float)
        a = np.asarray(attn_fwd_s, dtype=float)
        b = self._attn_bwd * a
        c = np.asarray(step_s, dtype=float)
        fwd = (r - 1) * np.maximum(a / r, c) + a / r
        bwd = (r - 1) * np.maximum(b / r, 2 * c) + b / r + c
        one = r <= 1
        return np.where(one, a, fwd), np.where(one, b, bwd)

    def _ring_attention_compute(
        self, tokens: np.ndarray, idx: np.ndarray, s: np.ndarray, ring: np.ndarray
    ) -> np.ndarray:
        """Attention compute per rank of each micro-batch (all layers) under ring attention: the
        same FLOPs over ``s`` ranks at the efficiency of full blocks of a sample's n / r keys."""
        if not self._arch.text_sp_kinds:
            raise ConfigError(
                f"ring attention prices 1-D text models; architecture {self._arch.name!r} runs "
                "ulysses (DSP) only"
            )
        n = np.asarray(tokens, dtype=float)
        fl = self.sample_flops(np.asarray(tokens), np.ones(len(n), dtype=np.int64))
        work = fl["attn"] / self.attention_efficiency(n / ring[idx], causal=False)
        return np.bincount(idx, weights=work, minlength=len(s)) / (s * self._peak)

    def _ring_exposed(
        self, t_attn: np.ndarray, ntok: np.ndarray, s: np.ndarray, u: np.ndarray, k: np.ndarray
    ) -> np.ndarray:
        """What the ring's transfers add beyond the attention compute they overlap, per
        micro-batch (0 where the ring has one rank)."""
        ring, L = s / u, self._L
        step = self.p2p_time(self.ring_step_bytes(ntok / ring, u), s > self.cluster.gpus_per_node)
        a = t_attn / L
        f, b = self.ring_attention_times(a, step, ring)
        return np.where(ring > 1, L * (f - a + b - self._attn_bwd * a) + k * (f - a), 0.0)

    def ring_exposed_comm(
        self, tokens: np.ndarray, sp: int, ulysses: int, ckpt_layers: int
    ) -> float:
        """Seconds per rank the ring's point-to-point steps add to one text micro-batch of
        ``tokens`` on ``sp`` ranks with a Ulysses part of ``ulysses`` (see
        `ring_attention_times`); 0 without a ring. The profiled source prices its rings with
        it (its profile measures no point-to-point)."""
        t = np.atleast_1d(np.asarray(tokens))
        if sp // ulysses <= 1:
            return 0.0
        s, u = np.array([float(sp)]), np.array([float(ulysses)])
        idx = np.zeros(len(t), dtype=np.int64)
        t_attn = self._ring_attention_compute(t, idx, s, s / u)
        ntok = np.array([float(t.sum())])
        return float(self._ring_exposed(t_attn, ntok, s, u, np.array([float(ckpt_layers)]))[0])

    def activation_bytes(
        self,
        tokens: np.ndarray,
        sp: np.ndarray,
        ckpt_layers: np.ndarray,
        frames: np.ndarray | None = None,
    ) -> np.ndarray:
        """Activation bytes per rank of each sample (sequence split over ``sp`` ranks): what the
        runtime's models keep for the backward, unit by unit (`dcp_bench.cost.activations`,
        equal to the bytes `dcp_bench.runtime.memory_count` counts from the models), per-sample
        terms (caption keys/values and features, timestep modulation) on every rank of the group.
        ``frames``: each sample's frames (STDiT: the attention path of each length,
        `ActivationTerms.layer_tok_at`); None prices every attention on its fused path.

        Stored layers keep everything, checkpointed ones their blocks' inputs (and, while any is
        checkpointed, the conditioning they take). Peak: at the start of the backward, (L-k)
        stored layers + k inputs; when a checkpointed block is recomputed the layers above it are
        already freed, so the inputs below + one full block. The second exceeds the first only
        when every layer is checkpointed."""
        n = np.asarray(tokens, dtype=float)
        n_r = n / np.asarray(sp, dtype=float)
        k = np.clip(np.asarray(ckpt_layers, dtype=float), 0, self._L)
        L, t = self._L, self._act_terms
        if frames is None:
            full_tok: np.ndarray | float = t.full_tok
        else:
            T = np.maximum(np.asarray(frames, dtype=float), 1.0)
            full_tok = t.full_tok_at(n / T, T)
        full_s, inp = t.full_sample, t.checkpoint_input_tok
        nb = t.blocks_per_layer
        every = k >= L
        per_tok = (
            (L - k) * full_tok
            + k * inp
            + np.where(k > 0, t.conditioning_held_tok, 0.0)
            + np.where(every, (full_tok - inp) / nb, 0.0)
        )
        per_tok = per_tok + sum(t.outer_tok.values()) + t.shared_tok
        per_sample = (
            (L - k) * full_s
            + np.where(every, full_s / nb, 0.0)
            + np.where(k > 0, t.conditioning_held_sample, 0.0)
            + sum(t.outer_sample.values())
            + t.shared_sample
        )
        return self._scale("act_bytes") * (n_r * per_tok + per_sample)

    def activation_breakdown(
        self,
        tokens: float | np.ndarray,
        samples: float = 1.0,
        sp: int = 1,
        ckpt_layers: int = 0,
        frames: np.ndarray | list[int] | None = None,
    ) -> dict[str, float]:
        """Bytes one micro-batch of ``tokens`` over ``samples`` samples keeps per rank, by unit
        (per-layer units multiplied by the stored layers; without the recomputation peak).
        ``frames``: each sample's frames, ``tokens`` then each sample's tokens (``samples`` is
        their number): every attention on the path of its length (`ActivationTerms.layer_tok_at`);
        None prices every attention on its fused path."""
        self._refuse_model_parallel("activation_breakdown")
        t, L = self._act_terms, self._L
        k = min(max(int(ckpt_layers), 0), L)
        if frames is None:
            n_r = float(np.sum(tokens)) / sp
            layer = {u: n_r * v for u, v in t.layer_tok.items()}
        else:
            n = np.atleast_1d(np.asarray(tokens, dtype=float))
            T = np.maximum(np.atleast_1d(np.asarray(frames, dtype=float)), 1.0)
            samples = float(len(n))
            n_r = float(n.sum()) / sp
            at = t.layer_tok_at(n / T, T)
            layer = {u: float(np.sum(n / sp * at[u])) for u in t.layer_tok}
        out = {
            f"layer.{u}": (L - k) * (layer[u] + samples * t.layer_sample.get(u, 0.0))
            for u in t.layer_tok
        }
        out["checkpoint_inputs"] = k * n_r * t.checkpoint_input_tok
        held = n_r * t.conditioning_held_tok + samples * t.conditioning_held_sample
        out["shared"] = n_r * t.shared_tok + (held if k > 0 else 0.0) + samples * t.shared_sample
        for u in sorted(set(t.outer_tok) | set(t.outer_sample)):
            out[u] = n_r * t.outer_tok.get(u, 0.0) + samples * t.outer_sample.get(u, 0.0)
        return {u: self._scale("act_bytes") * v for u, v in out.items()}

    # --------------------------------------------------------------------------- interface
    def with_model_parallel(self, mp: ModelParallel) -> AnalyticalCostModel:
        """A copy pricing ``mp`` (`dcp_bench.cost.megatron`): micro-batch costs per rank of the
        slowest pipeline stage, that stage's static memory and gradient sync; its ``zero_stage``
        becomes the layout's (Megatron shards optimizer states over the data-parallel ranks)."""
        megatron.check_layout(self, mp)
        out = copy.copy(self)
        out.model_parallel = mp
        out.zero_stage = mp.zero_stage
        out.provenance = {
            **self.provenance,
            "model_parallel": {
                "tp": mp.tp,
                "pp": mp.pp,
                "sequence_parallel": mp.sequence_parallel,
                "selective": mp.selective,
                "zero_stage": mp.zero_stage,
                "pricing": "dcp_bench.cost.megatron (Shoeybi et al. 2019; Korthikanti et al. "
                "2022 section 4 and Table 2; Narayanan et al. 2021 section 2.2)",
            },
        }
        return out

    def _refuse_model_parallel(self, what: str) -> None:
        if self.model_parallel is not None:
            raise ConfigError(
                f"{what} is not priced with tensor or pipeline parallelism "
                f"(tp={self.model_parallel.tp}, pp={self.model_parallel.pp})"
            )

    def static_memory_bytes(self) -> float:
        return float(sum(self.static_memory_breakdown().values()))

    def static_memory_breakdown(self) -> dict[str, float]:
        """Per-rank static memory by part (bytes): the training states as the runtime holds them
        at the run's ZeRO stage and precision (`dcp_bench.train_policy.static_state_bytes`: fp32
        master weights, AdamW moments and gradient accumulator), the workspace, and for language
        models one chunk of logits (`logits_chunk_bytes`). With `model_parallel`: one rank of
        the heaviest stage (`dcp_bench.cost.megatron.static_breakdown`)."""
        if self.model_parallel is not None:
            return megatron.static_breakdown(self, self.model_parallel)
        policy = precision_policy(self.model.dtype)
        out = static_state_bytes(
            self._params, self._layer_params, self.cluster.world_size, self.zero_stage, policy
        )
        out["workspace"] = float(self.cluster.gpu.workspace_bytes)
        vocab = self._arch.logits_vocab(self.model)
        if vocab:
            out["logits_chunk"] = logits_chunk_bytes(self.logits_chunk_tokens, vocab, policy)
        return {k: float(v) for k, v in out.items()}

    def allreduce_time(self, nbytes: float, ranks: int, stride: int = 1) -> float:
        """Time of one all-reduce of ``nbytes`` per rank over ``ranks`` aligned ranks: a
        hierarchical ring, reduce-scatter + all-gather inside the node, then an all-reduce of each
        GPU's 1/g shard across nodes (ZeRO's reduce-scatter + parameter all-gather move the same
        bytes as one all-reduce); ``allreduce_overlap`` of the shorter phase hidden under the
        longer. ``stride``: the ranks are every stride-th rank (a node holds gpus_per_node /
        stride of them; the data-parallel ranks of a tensor-parallel layout)."""
        c = self.cluster
        if ranks <= 1:
            return 0.0
        per_node = max(1, c.gpus_per_node // stride)
        g = min(per_node, ranks)
        nodes = max(1, ranks // per_node) if ranks > per_node else 1
        t = 0.0
        if g > 1:
            t += 2 * (g - 1) / g * nbytes / (c.intra_node_bw * self._allreduce)
            t += 2 * (g - 1) * self._ar_hop
        inter = 0.0
        if nodes > 1:
            inter += 2 * (nodes - 1) / nodes * (nbytes / g) / (c.inter_node_bw * self._ar_inter)
            inter += 2 * (nodes - 1) * c.inter_node_latency_s
        # NCCL pipelines the two phases; allreduce_overlap is the share of the shorter one hidden
        return t + inter - self._ar_overlap * min(t, inter)

    def step_sync_breakdown(self) -> dict[str, float]:
        """Gradient synchronisation and optimizer time once per step (s). With
        `model_parallel`: one rank of the heaviest stage (`dcp_bench.cost.megatron`)."""
        if self.model_parallel is not None:
            return megatron.step_breakdown(self, self.model_parallel)
        c = self.cluster
        # The step's gradient synchronisation as the runtime runs it (`grad_sync_bytes`: stage 0
        # an fp32 all-reduce, stage 1 an fp32 reduce-scatter plus a compute-dtype all-gather,
        # each moving half an all-reduce's bytes); allreduce_time prices 2x its argument.
        nbytes = grad_sync_bytes(self._params, self.zero_stage, precision_policy(self.model.dtype))
        comm = self.allreduce_time(nbytes / 2, c.world_size) if nbytes else 0.0
        shard = self._params / (c.world_size if self.zero_stage >= 1 else 1)
        opt = shard * ADAM_BYTES_PER_PARAM / c.gpu.measured_mem_bw
        ema = loss = 0.0
        if self.loop == "reference":
            ema_shard = self._params / (c.world_size if self.zero_stage >= 1 else 1)
            ema = (
                2 * ema_param_tensors(self.model) * self.op_dispatch_s
                + ema_shard * EMA_BYTES_PER_ELEMENT / c.gpu.measured_mem_bw
            )
            loss = self.allreduce_time(4.0, c.world_size)
        return {"grad_sync_s": comm, "optimizer_s": opt, "ema_s": ema, "loss_sync_s": loss}

    def fsdp_pass_time(self) -> float:
        """ZeRO stages 2-3 (FSDP): the parameter all-gathers and gradient reduce-scatter over the
        world inside every micro-batch (`fsdp_pass_bytes`, each moving half an all-reduce's
        bytes); 0 for stages 0-1."""
        nbytes = fsdp_pass_bytes(self._params, self.zero_stage, precision_policy(self.model.dtype))
        return self.allreduce_time(nbytes / 2, self.cluster.world_size) if nbytes else 0.0

    def step_sync_time(self) -> float:
        return float(sum(self.step_sync_breakdown().values()))

    def microbatch_costs(
        self,
        tokens: np.ndarray,
        frames: np.ndarray,
        mb_index: np.ndarray,
        sp: np.ndarray,
        ckpt_layers: np.ndarray,
        ulysses: np.ndarray | None = None,
    ) -> dict[str, np.ndarray]:
        """See `CostModel.microbatch_costs`. ``ulysses`` (one entry per micro-batch, None: each
        group's size) is the size of a micro-batch's head-sharding part: the group size for
        Ulysses, 1 for ring attention over the group, in between for hybrid SP (rings of group /
        ulysses ranks); see the module docstring. With `model_parallel`, ``sp`` is each
        micro-batch's context-parallel degree and the costs are a stage rank's
        (`dcp_bench.cost.megatron`)."""
        if self.model_parallel is not None:
            return megatron.microbatch_costs(
                self, self.model_parallel, tokens, frames, mb_index, sp, ckpt_layers, ulysses
            )
        m = len(sp)
        idx = np.asarray(mb_index)
        s = np.asarray(sp, dtype=float)
        k = np.asarray(ckpt_layers, dtype=float)
        u = s if ulysses is None else np.asarray(ulysses, dtype=float)
        ring = s / u
        fl = self.sample_flops(tokens, frames)

        def per_mb(x: np.ndarray | float) -> np.ndarray:
            return np.bincount(idx, weights=np.broadcast_to(x, idx.shape), minlength=m)

        ntok = per_mb(np.asarray(tokens, dtype=float))
        n_r = ntok / s
        rate = s * self._peak * self.gemm_efficiency(n_r)
        t_layer_gemm = per_mb(fl["layer_gemm"]) / rate + n_r * self._L * self._elem_tok_s
        t_head = per_mb(fl["head_gemm"]) / rate
        t_attn = per_mb(fl["attn_work"]) / (s * self._peak)
        L = self._L
        ringed = ring > 1
        if ringed.any():
            t_attn = np.where(ringed, self._ring_attention_compute(tokens, idx, s, ring), t_attn)
        blocks = L * self._act_terms.blocks_per_layer
        floor = self.layer_launch_s * blocks  # one pass over every block of the micro-batch
        fwd = t_layer_gemm + t_head + t_attn + floor
        bwd = 2.0 * (t_layer_gemm + t_head) + self._attn_bwd * t_attn + floor
        recompute = k / L * (t_layer_gemm + t_attn + floor)
        comm_layer = self.a2a_time(self.a2a_bytes_per_layer(n_r, u), u, collectives=2)
        comm = comm_layer * (2 * L + k) + self.fsdp_pass_time()
        if ringed.any():
            comm = comm + self._ring_exposed(t_attn, ntok, s, u, k)
        act = np.bincount(
            idx, weights=self.activation_bytes(tokens, s[idx], k[idx], frames), minlength=m
        )
        flops = 3.0 * per_mb(fl["layer_gemm"] + fl["head_gemm"] + fl["attn"])
        own = {
            "fwd_s": fwd,
            "bwd_s": bwd,
            "recompute_s": recompute,
            "comm_s": comm,
            "mem_bytes": act * (1.0 + self.allocator_fragmentation) + self.static_memory_bytes(),
            "model_flops": flops,
        }
        return self.with_added_costs(own, tokens, frames, idx, sp, ckpt_layers)

    def microbatch_cost(
        self,
        tokens: np.ndarray,
        frames: np.ndarray,
        sp: int,
        ckpt_layers: int,
        split: str = "sequence",
        sp_kind: str = "ulysses",
        ulysses_degree: int = 0,
    ) -> MicroBatchCost:
        """See `CostModel.microbatch_cost`; ``sp_kind`` and ``ulysses_degree`` as a plan's
        `dcp_bench.plan.MicroBatch` has them (ring: any group size; see the module docstring)."""
        tokens = np.atleast_1d(np.asarray(tokens, dtype=np.int64))
        frames = np.atleast_1d(np.asarray(frames, dtype=np.int64))
        u = ulysses_span(sp_kind, ulysses_degree, sp)
        self._check(u, ckpt_layers)
        if sp_kind != "ulysses" and not self._arch.text_sp_kinds:
            raise ConfigError(f"sp_kind={sp_kind!r} prices text models; video runs DSP (ulysses)")
        if split == "batch" and sp > 1:
            return self._batch_split_cost(tokens, frames, sp, ckpt_layers)
        if split not in ("sequence", "batch"):
            raise ConfigError(f"split={split!r}; expected 'sequence' or 'batch'")
        c = self.microbatch_costs(
            tokens,
            frames,
            np.zeros(len(tokens), dtype=np.int64),
            np.array([sp]),
            np.array([ckpt_layers]),
            None if u == sp else np.array([u]),
        )
        return MicroBatchCost.from_terms({key: float(v[0]) for key, v in c.items()})

    def _batch_split_cost(
        self, tokens: np.ndarray, frames: np.ndarray, sp: int, ckpt: int
    ) -> MicroBatchCost:
        """Whole samples dealt to the group's ranks as the runtime deals them (by tokens, largest
        first, to the least-loaded rank); the group finishes with its slowest rank; no
        sequence-parallel communication."""
        owner = deal_by_tokens(tokens, sp)
        used = np.unique(owner)
        c = self.microbatch_costs(
            tokens,
            frames,
            np.searchsorted(used, owner),
            np.ones(len(used)),
            np.full(len(used), ckpt),
        )
        times = {
            t.name: np.zeros(len(used)) if t.sequence_split_only else c[t.name]
            for t in self.time_terms
        }
        slow = int(np.argmax(self.total_time(times)))
        return MicroBatchCost.from_terms(
            {
                **{k: float(v[slow]) for k, v in times.items()},
                "mem_bytes": float(c["mem_bytes"].max()),
                "model_flops": float(c["model_flops"].sum()),
            }
        )

    def sample_time(
        self, tokens: np.ndarray, frames: np.ndarray, sp: int, ckpt_layers: int
    ) -> np.ndarray:
        n = len(tokens)
        c = self.microbatch_costs(
            tokens, frames, np.arange(n), np.full(n, sp), np.full(n, ckpt_layers)
        )
        return self.total_time(c)

    def sample_time_many(
        self, tokens: np.ndarray, frames: np.ndarray, sp: np.ndarray, ckpt_layers: np.ndarray
    ) -> np.ndarray:
        n = len(tokens)
        c = self.microbatch_costs(
            tokens,
            frames,
            np.arange(n),
            np.broadcast_to(np.asarray(sp), (n,)),
            np.broadcast_to(np.asarray(ckpt_layers), (n,)),
        )
        return self.total_time(c)

    def sample_time_packed_many(
        self, tokens: np.ndarray, frames: np.ndarray, sp: np.ndarray, ckpt_layers: np.ndarray
    ) -> np.ndarray:
        self._refuse_model_parallel("sample_time_packed_many")
        # `sample_time_packed` with a degree and checkpoint count per sample: the same
        # operations element by element, so the same values bit for bit.
        n = len(tokens)
        s = np.broadcast_to(np.asarray(sp, dtype=float), (n,))
        k = np.broadcast_to(np.asarray(ckpt_layers, dtype=float), (n,))
        L = self._L
        fl = self.sample_flops(tokens, frames)
        rate = s * self._peak * self._gemm_max
        n_r = np.asarray(tokens, dtype=float) / s
        attn = fl["attn_work"] / (s * self._peak)
        dense = fl["layer_gemm"] / rate + n_r * L * self._elem_tok_s
        layer = dense + attn
        fwd_bwd = 3.0 * (dense + fl["head_gemm"] / rate) + (1.0 + self._attn_bwd) * attn
        c = self.cluster
        bw = np.where(s > c.gpus_per_node, c.inter_node_bw, c.intra_node_bw) * self._a2a
        comm = self.a2a_bytes_per_layer(n_r, s.astype(np.int64)) * (s - 1) / s / bw * (2 * L + k)
        comm = np.where(s > 1, comm, 0.0)
        return fwd_bwd + k / L * layer + comm

    def sample_memory_many(
        self, tokens: np.ndarray, frames: np.ndarray, sp: np.ndarray, ckpt_layers: np.ndarray
    ) -> np.ndarray:
        self._refuse_model_parallel("sample_memory_many")
        n = len(tokens)
        return self.activation_bytes(
            tokens,
            np.broadcast_to(np.asarray(sp), (n,)),
            np.broadcast_to(np.asarray(ckpt_layers), (n,)),
            frames,
        ) * (1.0 + self.allocator_fragmentation)

    def sample_time_packed(
        self, tokens: np.ndarray, frames: np.ndarray, sp: int, ckpt_layers: int
    ) -> np.ndarray:
        self._refuse_model_parallel("sample_time_packed")
        s, k, L = float(sp), float(ckpt_layers), self._L
        fl = self.sample_flops(tokens, frames)
        rate = s * self._peak * self._gemm_max  # saturated GEMMs
        n_r = np.asarray(tokens, dtype=float) / s
        attn = fl["attn_work"] / (s * self._peak)
        dense = fl["layer_gemm"] / rate + n_r * L * self._elem_tok_s
        layer = dense + attn
        fwd_bwd = 3.0 * (dense + fl["head_gemm"] / rate) + (1.0 + self._attn_bwd) * attn
        comm = np.zeros_like(n_r)
        if sp > 1:  # bytes only: collective latencies are shared by the samples of a micro-batch
            c = self.cluster
            bw = (c.inter_node_bw if sp > c.gpus_per_node else c.intra_node_bw) * self._a2a
            comm = (
                self.a2a_bytes_per_layer(n_r, np.full(len(n_r), sp))
                * (s - 1)
                / s
                / bw
                * (2 * L + k)
            )
        return fwd_bwd + k / L * layer + comm

    def ring_packed_share(
        self, tokens: np.ndarray, frames: np.ndarray, sp: int, ulysses: int, ckpt_layers: int
    ) -> np.ndarray:
        self._refuse_model_parallel("ring_packed_share")
        # `microbatch_costs`' terms for a ring or hybrid micro-batch, split as
        # `sample_time_packed` splits Ulysses ones: saturated GEMMs, each sample's ring attention
        # compute (full blocks of n / r keys), the Ulysses all-to-all bytes over ``ulysses``
        # ranks. What is left is per micro-batch (GEMM inefficiency, latencies: at least
        # ``microbatch_overhead(ulysses, k)``) or non-negative (the ring's exposed transfers).
        s, k, L = float(sp), float(ckpt_layers), self._L
        t = np.asarray(tokens)
        fl = self.sample_flops(t, frames)
        rate = s * self._peak * self._gemm_max
        n_r = np.asarray(tokens, dtype=float) / s
        ring = s / ulysses
        if ring > 1:
            attn = self._ring_attention_compute(
                t, np.arange(len(t)), np.full(len(t), s), np.full(len(t), ring)
            )
        else:
            attn = fl["attn_work"] / (s * self._peak)
        dense = fl["layer_gemm"] / rate + n_r * L * self._elem_tok_s
        fwd_bwd = 3.0 * (dense + fl["head_gemm"] / rate) + (1.0 + self._attn_bwd) * attn
        comm = np.zeros_like(n_r)
        if ulysses > 1:
            u = np.full(len(n_r), float(ulysses))
            per_layer = self.a2a_time(self.a2a_bytes_per_layer(n_r, u), u, collectives=0)
            comm = per_layer * (2 * L + k)
        return fwd_bwd + k / L * (dense + attn) + comm

    def microbatch_overhead(self, sp: int, ckpt_layers: int) -> float:
        self._refuse_model_parallel("microbatch_overhead")
        # GEMM time at x tokens per rank is F / (s * peak * gmax) * (1 + half / x): the first term
        # is the packed share, the second F * half / (s * peak * gmax * x) with F / (s * x) at
        # least the per-token GEMM FLOPs (per-sample caption projections only add to it). The
        # all-to-all latencies are paid once per micro-batch; everything else is per token.
        k, L = float(ckpt_layers), self._L
        per_tok = 3.0 * (L * self._layer_gemm_tok + self._head_gemm_tok) + k * self._layer_gemm_tok
        gemm = per_tok * self._gemm_half / (self._peak * self._gemm_max)
        latency = float(self.a2a_time(np.zeros(1), np.array([sp]), collectives=2)[0]) * (2 * L + k)
        launch = self.layer_launch_s * self._act_terms.blocks_per_layer * (2 * L + k)
        return gemm + latency + launch

    def checkpointed_layer_bytes(self, tokens_per_rank: float, sp: int) -> float:
        self._refuse_model_parallel("checkpointed_layer_bytes")
        del sp  # the same law at every degree
        return float(
            self._scale("act_bytes")
            * (1.0 + self.allocator_fragmentation)
            * tokens_per_rank
            * self._act_terms.checkpoint_input_tok
        )

    def added_costs(
        self,
        tokens: np.ndarray,
        frames: np.ndarray,
        mb_index: np.ndarray,
        sp: np.ndarray,
        ckpt_layers: np.ndarray,
    ) -> dict[str, np.ndarray]:
        """`short_attn_s` and `host_input_s` (`dcp_bench.cost.reference_loop`)."""
        idx = np.asarray(mb_index)
        m = len(sp)
        s = np.asarray(sp, dtype=float)
        k = np.asarray(ckpt_layers, dtype=float)
        per_mb = np.bincount(idx, weights=self.short_attention_excess(tokens, frames), minlength=m)
        # forward, backward and the checkpointed layers' second forward, per rank of the group
        fwd_share = ATTN_FWD_TENSORS / (ATTN_FWD_TENSORS + ATTN_BWD_TENSORS)
        passes = 1.0 + k / self._L * fwd_share
        short = per_mb * passes / s
        host = np.zeros(m)
        if self.loop == "reference":
            host = (
                np.bincount(idx, weights=host_input_bytes(self.model, tokens), minlength=m)
                / HOST_TO_DEVICE_BW
            )
        return {"short_attn_s": short, "host_input_s": host}

    def short_attention_excess(self, tokens: np.ndarray, frames: np.ndarray) -> np.ndarray:
        """Seconds per sample (one rank's worth of the whole sample, forward + backward, all
        layers) by which the memory traffic of its fused attention calls over fewer than
        `SHORT_ATTENTION_KEYS` keys exceeds their FLOP-priced time (`sample_flops`). A call of
        ``n`` query rows moves ``n x h x b`` bytes per activation-sized tensor: 4 forward, 8
        backward, at the measured memory bandwidth."""
        n = np.asarray(tokens, dtype=float)
        m, b, h = self.model, self._b, self.model.hidden
        bw = self.cluster.gpu.measured_mem_bw
        per_row = h * b * (ATTN_FWD_TENSORS + ATTN_BWD_TENSORS) / bw
        flop_rate = self._peak
        bwd = 1.0 + self._attn_bwd
        return self._arch.short_attention_io(
            m, n, frames, self, per_row, flop_rate, bwd, SHORT_ATTENTION_KEYS
        )

    def sample_memory(
        self, tokens: np.ndarray, frames: np.ndarray, sp: int, ckpt_layers: int
    ) -> np.ndarray:
        """Activation bytes of each sample (`activation_bytes`) plus the allocator's
        fragmentation share of them (``allocator_fragmentation``, a separate term)."""
        self._refuse_model_parallel("sample_memory")
        n = len(tokens)
        return self.activation_bytes(tokens, np.full(n, sp), np.full(n, ckpt_layers), frames) * (
            1.0 + self.allocator_fragmentation
        )

    def _check(self, sp: int, ckpt_layers: int) -> None:
        if sp < 1 or sp & (sp - 1):
            raise ConfigError(f"sp={sp}: SP degree must be a power of two >= 1")
        if not 0 <= ckpt_layers <= self._L:
            raise ConfigError(f"ckpt_layers={ckpt_layers} outside 0..{self._L}")
