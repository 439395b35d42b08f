"""Tensor and pipeline parallelism priced by the analytical model (`ModelParallel` layouts).

A Megatron-style model replica of ``tp * pp * cp`` ranks; every number is per rank of the slowest
pipeline stage (the last: it also holds the vocabulary-parallel LM head), per micro-batch:

- compute: the stage's ``num_layers / pp`` layers, every GEMM and attention split over ``tp``
  ranks (Shoeybi et al. 2019, section 3: column- then row-parallel MLP and attention, heads
  split). A tensor-parallel GEMM has 1/tp of the columns, so under the per-GEMM efficiency law it
  runs as a full-width GEMM on tokens / tp rows (`AnalyticalCostModel.gemm_efficiency`); the
  memory-bound kernels run on the sequence-parallel shard (tokens / tp);
- tensor-parallel communication: with sequence parallelism every layer runs two all-gathers and
  two reduce-scatters of the micro-batch's ``tokens x hidden`` activation forward, and the same
  backward (Korthikanti et al. 2022, "Reducing Activation Recomputation in Large Transformer
  Models", section 4.2.2: they replace the two all-reduces of Shoeybi et al. and move the same
  bytes); each is a ring over the ``tp`` ranks of a node, ``(tp-1)/tp x bytes`` at the
  intra-node bandwidth x ``allreduce_eff`` plus ``tp-1`` hop latencies; a recomputed layer runs
  its forward's collectives again;
- pipeline communication: each micro-batch sends its activation forward and its gradient backward
  between stages (Narayanan et al. 2021, SC'21, section 2.2), the sequence-parallel shard
  (tokens / tp x hidden), over the inter-node link when the world / pp ranks of a stage fill a
  node (Megatron's default rank order: tensor, context, data, then pipeline outermost);
- context parallelism (ring attention over ``cp`` ranks) as the analytical model prices rings,
  with each rank's K/V block holding its tp-th of the heads and the ring crossing nodes when
  ``tp * cp`` ranks do;
- memory (Korthikanti et al. 2022, Table 2 and section 4.2.3): the activations the runtime's
  models keep per layer, divided by ``tp`` (tensor + sequence parallel: 34 s b h / t per layer with
  flash attention, which never stores the 5 a s^2 b scores); the first stage of 1F1B holds ``pp``
  micro-batches in flight (a bound for a replica that runs fewer), each with its
  ``num_layers / pp`` layers (and the embedding's output),
  the last stage one (with the final norm and the loss); the stage's parameters, gradients and
  optimizer states are those of its layers (and the embedding and head, on one stage: a bound)
  divided by ``tp``, the optimizer states sharded over the ``dp * cp`` ranks holding the same
  weights (ZeRO-1: Megatron's distributed optimizer); the loss's logits chunk is vocabulary
  parallel (/ tp). Full recompute keeps each layer's input, itself sequence-parallel (/ tp).
  Selective recompute (Korthikanti section 5) drops the attention scores, which flash attention
  never keeps: it saves nothing here and adds the core attention's forward to every layer's
  backward;
- the step: the data-parallel gradient sync over the ``dp * cp`` ranks of a stage (stride tp),
  the optimizer step over the stage's shard; the 1F1B pipeline of ``m`` micro-batches takes their
  per-stage times plus a bubble of ``(pp - 1)`` times the slowest of them (Narayanan et al. 2021,
  section 2.2.1: ``(p - 1)(t_f + t_b)``, exact for equal micro-batches), booked as idle time by
  the simulator (`pipeline_time`).

With ``tp = pp = 1`` every formula reduces to the analytical model's own; a test pins that
(tests/test_cost_megatron.py).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from dcp_bench.cost.constants import ADAM_BYTES_PER_PARAM
from dcp_bench.errors import ConfigError
from dcp_bench.train_policy import (
    check_zero_stage,
    grad_sync_bytes,
    logits_chunk_bytes,
    precision_policy,
    static_state_bytes,
)

if TYPE_CHECKING:
    from dcp_bench.cost.analytical import AnalyticalCostModel
    from dcp_bench.layout import ModelParallel


def check_layout(cost: AnalyticalCostModel, mp: ModelParallel) -> None:
    """Raise `ConfigError` when ``cost`` cannot price ``mp`` (its one-line reason)."""
    c, m = cost.cluster, cost.model
    mp.check(c.world_size, c.gpus_per_node, m.heads, m.num_layers)
    check_zero_stage(mp.zero_stage)
    if cost.loop != "runtime":
        raise ConfigError(
            f"model parallel layout: priced for this suite's training loop (cost loop "
            f"'runtime'), got loop={cost.loop!r}"
        )
    if not cost._arch.text_sp_kinds:  # the Megatron layout prices decoder language models
        raise ConfigError(
            f"model parallel layout: tensor and pipeline parallelism are priced for text "
            f"decoder models; {m.name!r} ({cost._arch.name}) is not one"
        )


def stage_param_count(cost: AnalyticalCostModel, mp: ModelParallel) -> float:
    """Parameters per rank of the heaviest stage: its layers and every parameter outside the
    layers (embedding, final norm, head: on one stage, which bounds the first and the last),
    split over ``tp`` (layer weights and the vocabulary-parallel embedding and head; the norms'
    few weights, replicated in Megatron, are counted split too)."""
    layers = cost._layer_params * (cost._L // mp.pp)
    return float(layers + (cost._params - cost._layer_params * cost._L)) / mp.tp


def static_breakdown(cost: AnalyticalCostModel, mp: ModelParallel) -> dict[str, float]:
    """`AnalyticalCostModel.static_memory_breakdown` of one rank of the heaviest stage."""
    policy = precision_policy(cost.model.dtype)
    c = cost.cluster
    shard_over = c.world_size // mp.model_ranks  # dp * cp ranks hold the same weights
    out = static_state_bytes(
        stage_param_count(cost, mp),  # type: ignore[arg-type]
        cost._layer_params // mp.tp,
        shard_over,
        mp.zero_stage,
        policy,
    )
    out["workspace"] = float(c.gpu.workspace_bytes)
    vocab = cost._arch.logits_vocab(cost.model)
    if vocab:
        out["logits_chunk"] = logits_chunk_bytes(cost.logits_chunk_tokens, vocab, policy) / mp.tp
    return {k: float(v) for k, v in out.items()}


def step_breakdown(cost: AnalyticalCostModel, mp: ModelParallel) -> dict[str, float]:
    """`AnalyticalCostModel.step_sync_breakdown` of one rank of the heaviest stage: the gradient
    sync over the ``dp * cp`` ranks holding its weights (every tp-th rank: `allreduce_time` with
    that stride) and the optimizer step over its shard."""
    c = cost.cluster
    ranks = c.world_size // mp.model_ranks
    params = stage_param_count(cost, mp)
    nbytes = grad_sync_bytes(params, mp.zero_stage, precision_policy(cost.model.dtype))  # type: ignore[arg-type]
    comm = cost.allreduce_time(nbytes / 2, ranks, stride=mp.tp) if nbytes else 0.0
    shard = params / (ranks if mp.zero_stage >= 1 else 1)
    opt = shard * ADAM_BYTES_PER_PARAM / c.gpu.measured_mem_bw
    return {"grad_sync_s": comm, "optimizer_s": opt, "ema_s": 0.0, "loss_sync_s": 0.0}


def tp_collective_time(cost: AnalyticalCostModel, nbytes: np.ndarray, tp: int) -> np.ndarray:
    """One all-gather or reduce-scatter over ``tp`` ranks of a node whose full (gathered) tensor
    is ``nbytes``: a ring of ``tp - 1`` steps of ``nbytes / tp`` each at the intra-node bandwidth
    x ``allreduce_eff``, each step paying the hop latency (half of `allreduce_time`'s intra-node
    phase)."""
    if tp <= 1:
        return np.zeros_like(np.asarray(nbytes, dtype=float))
    c = cost.cluster
    return (tp - 1) / tp * np.asarray(nbytes, dtype=float) / (c.intra_node_bw * cost._allreduce) + (
        tp - 1
    ) * cost._ar_hop


def pipeline_p2p_time(cost: AnalyticalCostModel, nbytes: np.ndarray, pp: int) -> np.ndarray:
    """The two stage-to-stage transfers of a micro-batch (activation forward, its gradient
    backward) of ``nbytes`` each; 0 without pipeline parallelism. Neighbouring stages are
    world / pp ranks apart (pipeline outermost), so inter-node once that fills a node."""
    if pp <= 1:
        return np.zeros_like(np.asarray(nbytes, dtype=float))
    c = cost.cluster
    spans = c.world_size // pp >= c.gpus_per_node
    return 2.0 * cost.p2p_time(np.asarray(nbytes, dtype=float), np.asarray(spans))


def activation_bytes(
    cost: AnalyticalCostModel,
    mp: ModelParallel,
    tokens: np.ndarray,
    cp: np.ndarray,
    ckpt_layers: np.ndarray,
) -> np.ndarray:
    """Activation bytes per rank of the heaviest stage for each sample (see the module
    docstring): `AnalyticalCostModel.activation_bytes` with the stage's layers, the micro-batches
    in flight and the tp split. ``ckpt_layers`` counts the model's recomputed layers (``pp``
    stages recompute ``ckpt_layers / pp`` each)."""
    n = np.asarray(tokens, dtype=float)
    n_r = n / np.asarray(cp, dtype=float) / mp.tp
    Ls = cost._L / mp.pp
    k = np.clip(np.asarray(ckpt_layers, dtype=float), 0, cost._L) / mp.pp
    t = cost._act_terms
    full_tok, inp, nb = t.full_tok, t.checkpoint_input_tok, t.blocks_per_layer
    every = k >= Ls
    layers = (
        (Ls - k) * full_tok
        + k * inp
        + np.where(k > 0, t.conditioning_held_tok, 0.0)
        + np.where(every, (full_tok - inp) / nb, 0.0)
    )
    if mp.pp == 1:
        per_tok = layers + sum(t.outer_tok.values()) + t.shared_tok
    else:
        first = mp.pp * (layers + t.outer_tok.get("embeddings", 0.0)) + t.shared_tok
        last = layers + sum(v for u, v in t.outer_tok.items() if u != "embeddings")
        per_tok = np.maximum(first, last)
    if t.full_sample or t.outer_sample or t.shared_sample or t.conditioning_held_sample:
        raise ConfigError(
            "model parallel layout: per-sample activation terms (conditioning models) are not "
            "priced with tensor or pipeline parallelism"
        )
    return cost._scale("act_bytes") * (n_r * per_tok)


def microbatch_costs(
    cost: AnalyticalCostModel,
    mp: ModelParallel,
    tokens: np.ndarray,
    frames: np.ndarray,
    mb_index: np.ndarray,
    cp: np.ndarray,
    ckpt_layers: np.ndarray,
    ulysses: np.ndarray | None,
) -> dict[str, np.ndarray]:
    """`CostModel.microbatch_costs` of the micro-batches of a `ModelParallel` plan: ``cp`` is
    each micro-batch's context-parallel degree (the ranks its sequence is split over), the
    rest as there. Per rank of the slowest stage (module docstring)."""
    m = len(cp)
    idx = np.asarray(mb_index)
    s = np.asarray(cp, dtype=float)
    k = np.asarray(ckpt_layers, dtype=float)
    u = s if ulysses is None else np.asarray(ulysses, dtype=float)
    ring = s / u
    tp, pp = float(mp.tp), float(mp.pp)
    fl = cost.sample_flops(tokens, frames)

    def per_mb(x: np.ndarray | float) -> np.ndarray:
        return np.bincount(idx, weights=np.broadcast_to(x, idx.shape), minlength=m)

    L = cost._L
    Ls = L / pp  # the stage's layers
    ntok = per_mb(np.asarray(tokens, dtype=float))
    n_r = ntok / s  # rows of the stage's tensor-parallel GEMMs on a rank
    rate = s * tp * cost._peak * cost.gemm_efficiency(n_r / tp)
    t_layer_gemm = per_mb(fl["layer_gemm"]) / pp / rate + n_r / tp * Ls * cost._elem_tok_s
    t_head = per_mb(fl["head_gemm"]) / rate
    t_attn = per_mb(fl["attn_work"]) / pp / (s * tp * cost._peak)
    ringed = ring > 1
    if ringed.any():
        full = cost._ring_attention_compute(tokens, idx, s, ring) / (tp * pp)
        t_attn = np.where(ringed, full, t_attn)
    blocks = Ls * cost._act_terms.blocks_per_layer
    floor = cost.layer_launch_s * blocks
    fwd = t_layer_gemm + t_head + t_attn + floor
    bwd = 2.0 * (t_layer_gemm + t_head) + cost._attn_bwd * t_attn + floor
    ks = k / pp  # the stage's recomputed layers
    recompute = ks / Ls * (t_layer_gemm + t_attn + floor)
    if mp.selective:
        recompute = recompute + np.where(ks < Ls, (Ls - ks) / Ls * t_attn, 0.0)
    comm_layer = cost.a2a_time(cost.a2a_bytes_per_layer(n_r, u), u, collectives=2)
    comm = comm_layer * (2 * Ls + ks) + cost.fsdp_pass_time()
    if ringed.any():
        comm = comm + _ring_exposed(cost, mp, t_attn, ntok, s, u, ks)
    if mp.tp > 1:
        act = n_r * cost.model.hidden * cost._b  # the gathered activation of one collective
        comm = comm + 4.0 * tp_collective_time(cost, act, mp.tp) * (2 * Ls + ks)
    if mp.pp > 1:
        comm = comm + pipeline_p2p_time(cost, n_r / tp * cost.model.hidden * cost._b, mp.pp)
    act_bytes = np.bincount(
        idx, weights=activation_bytes(cost, mp, tokens, s[idx], k[idx]), minlength=m
    )
    flops = 3.0 * per_mb(fl["layer_gemm"] + fl["head_gemm"] + fl["attn"])
    own = {
        "fwd_s": fwd,
        "bwd_s": bwd,
        "recompute_s": recompute,
        "comm_s": comm,
        "mem_bytes": act_bytes * (1.0 + cost.allocator_fragmentation) + cost.static_memory_bytes(),
        "model_flops": flops,
    }
    out = cost.with_added_costs(own, tokens, frames, idx, cp, ckpt_layers)
    # the terms a cost model adds per micro-batch (short attention's memory floor) are the
    # micro-batch's work spread over its context-parallel ranks: a stage rank does 1 / (tp pp)
    for name in out.keys() - own.keys():
        out[name] = out[name] / (tp * pp)
    return out


def _ring_exposed(
    cost: AnalyticalCostModel,
    mp: ModelParallel,
    t_attn: np.ndarray,
    ntok: np.ndarray,
    s: np.ndarray,
    u: np.ndarray,
    ks: np.ndarray,
) -> np.ndarray:
    """`AnalyticalCostModel._ring_exposed` for a stage of ``num_layers / pp`` layers whose ring
    ranks hold a tp-th of the K/V heads each and sit tp ranks apart."""
    ring, Ls = s / u, cost._L / mp.pp
    nbytes = cost.ring_step_bytes(ntok / ring, u) / mp.tp
    step = cost.p2p_time(nbytes, s * mp.tp > cost.cluster.gpus_per_node)
    a = t_attn / Ls
    f, b = cost.ring_attention_times(a, step, ring)
    return np.where(ring > 1, Ls * (f - a + b - cost._attn_bwd * a) + ks * (f - a), 0.0)


def pipeline_time(work_s: np.ndarray, longest_s: np.ndarray, pp: int) -> np.ndarray:
    """Time of groups running their micro-batches through a 1F1B pipeline of ``pp`` stages:
    ``work_s`` the sum of their micro-batches' per-stage times, ``longest_s`` the longest of
    them. The pipeline fills and drains once: a bubble of ``(pp - 1)`` micro-batch times
    (Narayanan et al. 2021, SC'21, section 2.2.1: ``(p - 1)(t_f + t_b)``), taken at the longest
    micro-batch (exact when they are equal)."""
    if pp <= 1:
        return work_s
    return work_s + (pp - 1) * longest_s
