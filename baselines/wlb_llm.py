"""`wlb_llm`: WLB-LLM (Wang et al., "WLB-LLM: Workload-Balanced 4D Parallelism for Large Language
Model Training", OSDI'25, arXiv 2503.17924), reimplemented from the paper's text.

Its three mechanisms, all on by default as the paper evaluates them (§7):

- *Variable-length packing* (§4.1, Equation 2): the documents of an iteration go into ``N``
  micro-batches so that the largest total workload ``W_a(d) + W_l(d)`` (attention, quadratic in
  the document length, plus everything linear) is as small as possible, each micro-batch under
  ``S_max``, the most tokens GPU memory permits. Here ``W_a + W_l`` is the cost model's packed
  share of a document (`CostModel.sample_time_packed`) and ``S_max`` the most tokens one
  micro-batch holds under the memory cap at the CP degree.
- *Outlier document delay* (§4.2) with the *heuristic packing* of Algorithm 1 (§4.3): documents
  at least ``L_1`` long wait in a multi-level FIFO queue (queue ``i`` holds
  ``L_i <= d < L_{i+1}``) until a queue holds ``N`` of them, then ``N`` leave together, one per
  micro-batch; the iteration's documents, longest first after the documents left over from the
  previous iteration, go to the micro-batch of least workload if it has room, else to the one
  of fewest tokens, else wait for the next iteration. Delaying changes which documents a step
  trains on, so the planner deals its own batches (`deal_batch`, the run path's `BatchDealer`
  capability): every document trains exactly once over a run, later than it arrived when it
  waited; the step's batch, its plan and its lower bound are what it trains.
- *Per-document CP sharding* (§5.1): within a CP group every document is cut into ``2 CP``
  chunks and rank ``r`` takes chunks ``r`` and ``2 CP - 1 - r`` of each, so every rank holds the
  same causal attention work of every document. A micro-batch on a CP group of more than one
  rank runs ring attention across the CP ring (`cp_attention_kind`: across nodes, heads split
  inside a node by default), and the cost model prices ring attention exactly so: each
  document split over the ring with the causal load-balanced chunk pair per rank, kernels at
  the efficiency of the document's ``n / CP`` chunks
  (`AnalyticalCostModel.ring_attention_times`), which charges §5.2's short-chunk loss. The
  planner's micro-batches are therefore priced as per-document sharding.
- *Adaptive sharding selection* (§5.3): per micro-batch the sharding with the smaller predicted
  slowest-rank attention latency, per-document or per-sequence (the packed sequence cut into
  ``2 CP`` chunks, the CP baseline), predicted by `cp_rank_attention` (causal query-key pairs
  per rank with each document's query rows padded to the 128-row FlashAttention tile, §5.2).
  The plan IR has no per-micro-batch sharding field, so a micro-batch for which §5.3 picks
  per-sequence sharding is still priced as per-document ring attention: an approximation
  against WLB-LLM (§5.3 picks per-sequence only where it predicts it faster). The plan records
  how often that happens and the predicted attention it would save (``plan.info["cp_sharding"]``).

The CP degree is fixed (the paper's configurations fix TP, CP, PP and DP per model and context
window, Table 1); ``N`` is ``dp * k`` micro-batches, ``k`` per data-parallel replica (the paper's
global batch is ``PP_size x DP_size`` micro-batches, §7.1; this plan IR has no pipeline, so a
replica runs its ``k`` micro-batches as gradient-accumulation steps). See baselines/README.md.
"""

from __future__ import annotations

import heapq
import math
from collections import deque
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from baselines.scheduling import (
    check_sp_degree,
    ckpt_layers_for,
    largest_fitting,
    microbatch_fits,
    microbatch_memory,
    pack_under_budget,
    recompute_holding_longest,
    smallest_sp_for_batch,
    static_round,
    whole_cp_degrees,
)
from dcp_bench.archs import arch_of
from dcp_bench.batch import GlobalBatch
from dcp_bench.errors import ConfigError, InfeasibleError
from dcp_bench.plan import MicroBatch, Mode, SPKind, StepPlan
from dcp_bench.planners.base import Planner

if TYPE_CHECKING:
    from dcp_bench.cost.base import CostModel

# per_sequence is the CP baseline §5.1 compares against; the plan IR cannot price it (module
# docstring), so it is refused as a fixed setting
SHARDINGS = ("adaptive", "per_document")
FLASH_TILE = 128  # FlashAttention's query tile: shorter query blocks are padded to it (§5.2)


# ------------------------------------------------------------------ §4.2: the outlier queues


def default_thresholds(context_window: int, queues: int) -> list[int]:
    """``L_1 < ... < L_n`` for ``n`` queues when none are given: one queue per octave below the
    context window, ``context / 2^n, ..., context / 4, context / 2`` (1 queue: documents of at
    least half the window; 3 queues: from an eighth). The paper tunes ``L_i`` on a sample of
    the training documents (§4.2, "Tuning Hyperparameter"); this rule is our stand-in."""
    return [max(1, context_window >> (queues - i)) for i in range(queues)]


@dataclass(frozen=True)
class Doc:
    """A document waiting in the planner: its sample id, tokens and latent frames."""

    sample_id: int
    tokens: int
    frames: int


class OutlierQueues:
    """The multi-level FIFO waiting queue of §4.2: queue ``i`` holds the outliers with
    ``L_i <= d < L_{i+1}`` (the last queue has no upper end)."""

    def __init__(self, thresholds: list[int]) -> None:
        self.thresholds = sorted(int(t) for t in thresholds)
        self.queues: list[deque[Doc]] = [deque() for _ in self.thresholds]

    def queue_of(self, tokens: int) -> int | None:
        """The queue a document of ``tokens`` tokens waits in; None when it is no outlier."""
        q = None
        for i, t in enumerate(self.thresholds):
            if tokens >= t:
                q = i
        return q

    def admit(self, docs: list[Doc]) -> list[Doc]:
        """Algorithm 1, lines 4-10: queue the outliers, return the rest in their order."""
        rest = []
        for d in docs:
            q = self.queue_of(d.tokens)
            if q is None:
                rest.append(d)
            else:
                self.queues[q].append(d)
        return rest

    def release(self, n: int) -> list[Doc]:
        """Algorithm 1, lines 11-15: every queue holding at least ``n`` documents gives its
        ``n`` oldest."""
        out: list[Doc] = []
        for q in self.queues:
            if len(q) >= n:
                out.extend(q.popleft() for _ in range(n))
        return out

    def waiting(self) -> list[Doc]:
        return [d for q in self.queues for d in q]


# ------------------------------------------------------------- §4.3: Algorithm 1's packing


def pack_var_length(
    tokens: np.ndarray, work: np.ndarray, n_micro: int, s_max: int, carried: int = 0
) -> tuple[list[list[int]], list[int]]:
    """Algorithm 1, lines 16-32: the first ``carried`` items (the documents left over from the
    previous iteration) in their order, then the others longest first; each to the micro-batch
    of least workload if its tokens stay within ``s_max``, else to the micro-batch of fewest
    tokens if they do there, else left over. Returns the item indices per micro-batch and the
    left-over indices. Ties go to the lowest micro-batch index (deterministic)."""
    rest = sorted(range(carried, len(tokens)), key=lambda i: (-int(tokens[i]), i))
    order = list(range(carried)) + rest
    bins: list[list[int]] = [[] for _ in range(n_micro)]
    load = np.zeros(n_micro)
    size = np.zeros(n_micro, dtype=np.int64)
    left: list[int] = []
    for i in order:
        t = int(tokens[i])
        w_idx = int(np.argmin(load))  # argmin: ties go to the lowest index
        l_idx = int(np.argmin(size))
        # the paper writes "< S_max"; "<=" lets a document of exactly S_max tokens run alone
        if size[w_idx] + t <= s_max:
            b = w_idx
        elif size[l_idx] + t <= s_max:
            b = l_idx
        else:
            left.append(i)
            continue
        bins[b].append(i)
        load[b] += float(work[i])
        size[b] += t
    return bins, left


def imbalance_degree(latencies: list[float] | np.ndarray) -> float:
    """§7.4's imbalance degree of one batch: ``Max_Latency x N / Total_Latency`` over its ``N``
    micro-batches (the paper's N is PP_size: 1.0 is perfect balance)."""
    lat = np.asarray(latencies, dtype=float)
    return float(lat.max() * len(lat) / lat.sum()) if lat.size and lat.sum() > 0 else 1.0


# --------------------------------------------------------- §5.1 and §5.3: CP sharding


def _causal_work(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Attention work of the query positions ``[a, b)`` of a document under a causal mask (query
    ``p`` sees ``p + 1`` keys): ``sum_{p=a}^{b-1} (p + 1)``."""
    return (b * (b + 1) - a * (a + 1)) / 2.0


def cp_rank_attention(
    lengths: list[int], cp: int, sharding: str, tile: int = FLASH_TILE
) -> list[float]:
    """Attention work (query-key pairs) of each of ``cp`` ranks for one packed micro-batch of
    documents ``lengths`` (causal, each document attends to itself), each document's queries on
    a rank padded to whole kernel tiles of ``tile`` rows (§5.2).

    ``per_sequence`` (the CP baseline, §5.1): the packed sequence is cut into ``2 cp`` equal
    chunks and rank ``r`` takes chunks ``r`` and ``2 cp - 1 - r``. ``per_document`` (§5.1): every
    document is cut into ``2 cp`` equal chunks, rank ``r`` takes its symmetric pair of each; the
    tokens past the largest multiple of ``2 cp`` go round-robin over the ranks, continuing from
    one document to the next, so no padding is needed and every rank gets the same number of
    tokens ("Avoid Padding")."""
    if sharding not in ("per_sequence", "per_document"):
        raise ConfigError(f"sharding={sharding!r}; expected per_sequence or per_document")
    d = np.asarray(lengths, dtype=np.int64)
    m, chunks = len(d), 2 * cp
    exact = np.zeros((m, cp))
    queries = np.zeros((m, cp))
    if sharding == "per_sequence":
        total = int(d.sum())
        starts = np.concatenate([[0], np.cumsum(d)[:-1]])
        for c in range(chunks):
            lo, hi = total * c // chunks, total * (c + 1) // chunks
            a = np.clip(lo - starts, 0, d)
            b = np.clip(hi - starts, 0, d)
            r = c if c < cp else chunks - 1 - c
            exact[:, r] += _causal_work(a, b)
            queries[:, r] += b - a
    else:
        e = d // chunks
        for c in range(chunks):
            r = c if c < cp else chunks - 1 - c
            exact[:, r] += _causal_work(c * e, (c + 1) * e)
            queries[:, r] += e
        rem = d - e * chunks
        n_rem = int(rem.sum())
        if n_rem:
            doc = np.repeat(np.arange(m), rem)
            first = np.concatenate([[0], np.cumsum(rem)[:-1]])
            pos = e[doc] * chunks + (np.arange(n_rem) - first[doc])
            rank = np.arange(n_rem) % cp
            np.add.at(exact, (doc, rank), pos + 1.0)
            np.add.at(queries, (doc, rank), 1.0)
    padded = np.ceil(queries / tile) * tile
    work = np.where(queries > 0, exact * padded / np.maximum(queries, 1.0), 0.0)
    return [float(x) for x in work.sum(axis=0)]


def choose_sharding(lengths: list[int], cp: int, tile: int = FLASH_TILE) -> tuple[str, float]:
    """§5.3: the sharding with the smaller predicted attention latency (its slowest rank's
    padded work), and that strategy's CP imbalance (slowest rank over the mean)."""
    best: tuple[float, str, list[float]] | None = None
    for s in ("per_document", "per_sequence"):
        w = cp_rank_attention(lengths, cp, s, tile)
        if best is None or max(w) < best[0]:
            best = (max(w), s, w)
    assert best is not None
    mean = sum(best[2]) / cp
    return best[1], (best[0] / mean if mean > 0 else 1.0)


CP_LAYOUTS = ("hybrid", "ring")


def cp_attention_kind(cost: CostModel, sp: int, layout: str = "hybrid") -> tuple[SPKind, int]:
    """How a micro-batch's attention spans its group of ``sp`` ranks, as (``sp_kind``,
    ``ulysses_degree``).

    ``hybrid`` (the default): the paper's layout puts tensor parallelism inside a node and CP
    across nodes (its 4D configurations combine TP with CP, Table 1); the plan IR has no
    tensor parallelism, so the ranks inside a node split the heads (Ulysses, its stand-in) and
    the CP ring runs across the nodes (``hybrid`` with ``ulysses_degree`` = GPUs per node), or
    Ulysses alone when the group fits one node. ``ring``: the whole group is one CP ring (TP 1).
    Ring attention is priced for text models only on cost models that price it
    (`CostModel.prices_ring`); elsewhere (video models, other cost models) the suite's Ulysses.
    ``plan.info["cp_attention"]`` says which."""
    if layout not in CP_LAYOUTS:
        raise ConfigError(f"cp_layout={layout!r}; expected one of {', '.join(CP_LAYOUTS)}")
    if sp <= 1 or not arch_of(cost.model).text_sp_kinds or not cost.prices_ring:
        return "ulysses", 0
    if layout == "ring":
        return "ring", 0
    node = cost.cluster.gpus_per_node
    if sp <= node:
        return "ulysses", 0
    return "hybrid", node


# ------------------------------------------------------------------------------ the planner


class WLBLLM(Planner):
    """WLB-LLM: variable-length packing with outlier delay (Algorithm 1) over a fixed CP degree,
    each micro-batch on its CP group as ring attention with per-document sharding (§5.1), the
    adaptive choice of §5.3 recorded per micro-batch.

    Args:
        mode: labels runs only.
        sp: the fixed CP (SP) degree; None = the smallest that fits the longest sequence seen
            so far (it never shrinks).
        recompute: "selective" (the suite's stand-in: the first half of the layers), "full"
            or "none"; None = `packed_static`'s default (selective, full once selective cannot
            hold the longest sequence): the paper does not say, so the two differ only in
            WLB-LLM's own mechanisms.
        outlier_queues: ``n``, the number of outlier queues (§4.2); 0 turns the delay off
            (variable-length packing alone, every document in the step it arrives).
        outlier_thresholds: ``L_1 < ... < L_n`` in tokens; None = `default_thresholds` of
            ``context_window``.
        context_window: the training context window in tokens (the paper's 64K / 128K); None =
            the model's maximum sequence length capped at 131072.
        micro_batches_per_replica: ``k``; None = the fewest whose ``S_max`` tokens hold the
            iteration's documents.
        s_max: most tokens of one micro-batch over the CP group; None = what the memory cap
            allows at the CP degree.
        sharding: ``adaptive`` (§5.3) or ``per_document`` (§5.1, the paper's Fig. 13 ablation
            without the selection); both priced as per-document ring attention, ``adaptive``
            recording where §5.3 would pick per-sequence (module docstring).
        cp_layout: ``hybrid`` (heads split inside a node as the stand-in for the paper's TP,
            the CP ring across nodes) or ``ring`` (one ring over the whole group, TP 1); see
            `cp_attention_kind`.
    """

    name = "wlb_llm"
    source = (
        "WLB-LLM (OSDI'25, arXiv 2503.17924). Defaults as the paper evaluates it: variable-length "
        "packing with 2 outlier-delay queues (Algorithm 1, §4.2-4.3; documents wait to a later "
        "step), per-document CP sharding priced as ring attention across nodes with heads split "
        "inside a node (§5.1; the stand-in for the paper's TP, Table 1), the adaptive "
        "per-document / per-sequence choice (§5.3) recorded; the smallest CP degree that fits the "
        "longest sequence; packed_static's recompute (selective, full once it cannot hold the "
        "longest; the paper does not say)."
    )
    OPTION_MINIMA = {"token_capacity": 1}
    SP_OPTIONS = ("sp",)
    # a CP size that divides the world runs as a ring (whole nodes) beside the powers of two
    SP_POWER_OF_TWO = False

    def __init__(
        self,
        mode: Mode = "fair",
        sp: int | None = None,
        recompute: str | None = None,
        outlier_queues: int = 2,
        outlier_thresholds: list[int] | None = None,
        context_window: int | None = None,
        micro_batches_per_replica: int | None = None,
        s_max: int | None = None,
        sharding: str = "adaptive",
        cp_layout: str = "hybrid",
    ) -> None:
        super().__init__(mode)
        self._fallback = recompute is None
        recompute = recompute or "selective"
        ckpt_layers_for(recompute, 1)
        if outlier_queues < 0:
            raise ConfigError(f"outlier_queues={outlier_queues}; expected >= 0")
        if outlier_thresholds is not None:
            th = [int(t) for t in outlier_thresholds]
            if len(th) != outlier_queues or any(t < 1 for t in th) or th != sorted(set(th)):
                raise ConfigError(
                    f"outlier_thresholds={outlier_thresholds}; expected {outlier_queues} "
                    "increasing positive token counts (one per queue)"
                )
        for key, v in (
            ("context_window", context_window),
            ("micro_batches_per_replica", micro_batches_per_replica),
            ("s_max", s_max),
        ):
            if v is not None and v < 1:
                raise ConfigError(f"{key}={v}; expected a positive integer or null")
        if sharding == "per_sequence":
            raise ConfigError(
                "sharding='per_sequence': the plan IR prices ring micro-batches with per-document "
                "balance and cannot express per-sequence sharding's rank imbalance; expected "
                "adaptive or per_document"
            )
        if sharding not in SHARDINGS:
            raise ConfigError(f"sharding={sharding!r}; expected one of {', '.join(SHARDINGS)}")
        self.sp = sp
        self.recompute = recompute
        self.outlier_queues = outlier_queues
        self.outlier_thresholds = outlier_thresholds
        self.context_window = context_window
        self.micro_batches_per_replica = micro_batches_per_replica
        self.s_max = s_max
        self.sharding = sharding
        if cp_layout not in CP_LAYOUTS:
            raise ConfigError(f"cp_layout={cp_layout!r}; expected one of {', '.join(CP_LAYOUTS)}")
        self.cp_layout = cp_layout
        self._auto_sp = 1
        self._queues: OutlierQueues | None = None
        self._remained: list[Doc] = []
        self._dealt: dict[int, dict[str, Any]] = {}

    # -------------------------------------------------------------- settings of a step

    def thresholds(self, cost: CostModel) -> list[int]:
        if self.outlier_thresholds is not None:
            return [int(t) for t in self.outlier_thresholds]
        window = self.context_window or min(cost.model.max_seq_len, 131072)
        return default_thresholds(window, self.outlier_queues)

    def ring_degrees(self, cost: CostModel) -> list[int]:
        """CP degrees beyond the powers of two (`whole_cp_degrees`): the paper fixes one CP
        degree per configuration (Table 1) on Megatron-style CP groups, whose only rule is that
        the CP size divides the world; the ``hybrid`` layout (Ulysses inside a node, the ring
        across) needs a multiple of the node. Tried only when no power of two holds the longest
        sequence, so the degree stays fixed for the run once chosen."""
        return whole_cp_degrees(cost, hierarchical=self.cp_layout == "hybrid")

    def degree(self, batch: GlobalBatch, cost: CostModel, ckpt: int) -> int:
        extra = self.ring_degrees(cost)
        if self.sp is not None:
            sp = int(self.sp)
            # ring attention: the heads do not limit the CP degree
            check_sp_degree(sp, cost.cluster.world_size, extra=extra)
            return sp
        self._auto_sp = max(self._auto_sp, smallest_sp_for_batch(batch, cost, ckpt, extra))
        return self._auto_sp

    def token_limit(self, cost: CostModel, sp: int, ckpt: int, longest: int = 0) -> int:
        """``S_max``: the most tokens one micro-batch holds on ``sp`` ranks under the cap (the
        search reaches the model's maximum length, or ``longest``, times ``sp``)."""
        if self.s_max is not None:
            return int(self.s_max)

        def fits(n: int) -> bool:
            t = np.array([n], dtype=np.int64)
            return bool(
                microbatch_memory(cost, t, np.ones(1, dtype=np.int64), sp, ckpt, "sequence")
                <= cost.memory_cap_bytes
            )

        return largest_fitting(fits, max(1, cost.model.max_seq_len, longest) * sp)

    def replicas_and_k(self, tokens: int, W: int, sp: int, s_max: int) -> tuple[int, int]:
        dp = W // sp
        k = self.micro_batches_per_replica or max(1, math.ceil(tokens / (dp * s_max)))
        return dp, k

    # --------------------------------------------------- the run path's batch dealer

    def deal_batch(self, batch: GlobalBatch, cost: CostModel) -> GlobalBatch:
        """The documents this step trains (Algorithm 1 over the run): the ones left over from
        the previous iteration, the fresh ones that are no outliers, and the outliers released
        by a full queue; the new outliers wait, and what does not fit the micro-batches waits
        for the next step. Without outlier queues the batch is returned unchanged."""
        if self.outlier_queues == 0:
            return batch
        if self._fallback:
            self.recompute = recompute_holding_longest(
                batch, cost, self.recompute, extra=self.ring_degrees(cost)
            )
        ckpt = ckpt_layers_for(self.recompute, cost.model.num_layers)
        W = cost.cluster.world_size
        if self._queues is None:
            self._queues = OutlierQueues(self.thresholds(cost))
        sp = self.degree(batch, cost, ckpt)
        longest = int(batch.tokens.max()) if batch.n else 0
        s_max = self.token_limit(
            cost, sp, ckpt, max(longest, *(d.tokens for d in self._remained), 0)
        )
        fresh = [
            Doc(int(batch.sample_ids[p]), int(batch.tokens[p]), int(batch.frames[p]))
            for p in range(batch.n)
        ]
        new = self._queues.admit(fresh)
        dp, k = self.replicas_and_k(sum(d.tokens for d in fresh), W, sp, s_max)
        new += self._queues.release(dp * k)
        carried = self._remained
        docs = carried + new
        tok = np.array([d.tokens for d in docs], dtype=np.int64)
        fr = np.array([d.frames for d in docs], dtype=np.int64)
        work = cost.sample_time_packed(tok, fr, sp, ckpt) if docs else np.zeros(0)
        bins, left = pack_var_length(tok, work, dp * k, s_max, carried=len(carried))
        if bins and not any(bins) and left:
            # nothing fits (s_max below every document): plan() names the document
            bins, left = [list(range(len(docs)))], []
        self._remained = [docs[i] for i in left]
        kept = [i for b in bins for i in b]
        by_pos = {i: n for n, i in enumerate(kept)}
        dealt = GlobalBatch(
            step=batch.step,
            sample_ids=np.array([docs[i].sample_id for i in kept], dtype=np.int64),
            tokens=np.array([docs[i].tokens for i in kept], dtype=np.int64),
            frames=np.array([docs[i].frames for i in kept], dtype=np.int64),
            truncated=batch.truncated,
            dropped=batch.dropped,
            info={**batch.info, "wlb_llm_dealt": True},
        )
        fresh_ids = {d.sample_id for d in fresh}
        self._dealt[batch.step] = {
            "ids": dealt.sample_ids.tolist(),
            "bins": [[by_pos[i] for i in b] for b in bins],
            "sp": sp,
            "k": k,
            "s_max": s_max,
            "delayed": sorted(
                d.sample_id
                for d in self._queues.waiting() + self._remained
                if d.sample_id in fresh_ids
            ),
            "released": sorted(
                int(i) for i in dealt.sample_ids.tolist() if int(i) not in fresh_ids
            ),
            "waiting": len(self._queues.waiting()) + len(self._remained),
        }
        return dealt

    # ---------------------------------------------------------------------- planning

    def plan(self, batch: GlobalBatch, cost: CostModel) -> StepPlan:
        W = cost.cluster.world_size
        if self._fallback:
            self.recompute = recompute_holding_longest(
                batch, cost, self.recompute, extra=self.ring_degrees(cost)
            )
        ckpt = ckpt_layers_for(self.recompute, cost.model.num_layers)
        dealt = self._dealt.pop(batch.step, None)
        if dealt is not None and dealt["ids"] != batch.sample_ids.tolist():
            dealt = None  # a batch this planner did not deal: pack it as it is
        if dealt is not None:
            sp, k, s_max, bins = dealt["sp"], dealt["k"], dealt["s_max"], dealt["bins"]
            check_sp_degree(sp, W, extra=self.ring_degrees(cost))
        else:
            sp = self.degree(batch, cost, ckpt)
            s_max = self.token_limit(cost, sp, ckpt, int(batch.tokens.max()) if batch.n else 0)
            _, k = self.replicas_and_k(batch.total_tokens, W, sp, s_max)
            bins = []
        dp = W // sp
        room = cost.memory_cap_bytes - cost.static_memory_bytes()
        if batch.n:
            act = cost.sample_memory(batch.tokens, batch.frames, sp, ckpt)
            if float(act.max()) > room or int(batch.tokens.max()) > s_max:
                p = int(np.argmax(batch.tokens))
                raise InfeasibleError(
                    f"sample {p} ({int(batch.tokens[p])} tokens) does not fit one micro-batch "
                    f"at the fixed CP degree {sp} (S_max={s_max} tokens)"
                )
        work = (
            cost.sample_time_packed(batch.tokens, batch.frames, sp, ckpt)
            if batch.n
            else np.zeros(0)
        )
        if dealt is None and batch.n:
            # every document of the step runs in it: more micro-batches until all are placed
            while True:
                bins, left = pack_var_length(batch.tokens, work, dp * k, s_max)
                if not left:
                    break
                k += 1
        per_group = _deal_micro_batches(
            batch, cost, bins, work, dp, k, sp, ckpt, s_max, self.cp_layout
        )
        info: dict[str, Any] = {
            "sp": sp,
            "ckpt_layers": ckpt,
            "recompute": self.recompute,
            "s_max": s_max,
            "micro_batches_per_replica": k,
            "outlier_thresholds": self.thresholds(cost) if self.outlier_queues else [],
            "delayed_samples": dealt["delayed"] if dealt else [],
            "released_samples": dealt["released"] if dealt else [],
            "documents_waiting": dealt["waiting"] if dealt else 0,
            "imbalance_degree": imbalance_degree(
                [float(work[list(mb.samples)].sum()) for g in per_group for mb in g]
            ),
        }
        kind, uly = cp_attention_kind(cost, sp, self.cp_layout)
        info["cp_attention"] = kind if kind != "hybrid" else f"hybrid (ulysses {uly})"
        # the CP degree is the ring's: the whole group for a ring, the nodes for a hybrid (the
        # in-node head split stands in for TP); Ulysses alone (no ring) has no CP sharding
        cp = sp if kind == "ring" else (sp // uly if kind == "hybrid" else 1)
        info["cp_degree"] = cp
        if cp > 1:
            info["cp_sharding"] = self._sharding_info(batch, per_group, cp)
        return StepPlan(
            world_size=W,
            rounds=[static_round(W, sp, per_group)],
            method=self.name,
            mode=self.mode,
            step=batch.step,
            info=info,
        )

    def _sharding_info(
        self, batch: GlobalBatch, per_group: list[list[MicroBatch]], sp: int
    ) -> dict[str, Any]:
        """How many micro-batches §5.3 would give each CP sharding, the worst predicted CP
        imbalance (slowest rank's attention over the mean) of the sharding chosen, and the share
        of the per-document slowest-rank attention (`cp_rank_attention`, summed over the
        micro-batches) that the per-sequence choices would save: what the plan's per-document
        price overcharges WLB-LLM by in attention (module docstring)."""
        counts = {"per_document": 0, "per_sequence": 0}
        worst, doc_total, saved = 1.0, 0.0, 0.0
        for g in per_group:
            for mb in g:
                lengths = [int(batch.tokens[p]) for p in mb.samples]
                w_doc = cp_rank_attention(lengths, sp, "per_document")
                doc_total += max(w_doc)
                if self.sharding == "adaptive":
                    s, imb = choose_sharding(lengths, sp)
                    if s == "per_sequence":
                        saved += max(w_doc) - max(cp_rank_attention(lengths, sp, s))
                else:
                    s = self.sharding
                    imb = max(w_doc) * sp / sum(w_doc) if sum(w_doc) > 0 else 1.0
                counts[s] += 1
                worst = max(worst, imb)
        return {
            "mode": self.sharding,
            "priced_as": "per_document",
            **counts,
            "max_cp_imbalance": round(worst, 4),
            "per_sequence_attention_saving": round(saved / doc_total, 4) if doc_total else 0.0,
        }


def _deal_micro_batches(
    batch: GlobalBatch,
    cost: CostModel,
    bins: list[list[int]],
    work: np.ndarray,
    dp: int,
    k: int,
    sp: int,
    ckpt: int,
    s_max: int,
    cp_layout: str,
) -> list[list[MicroBatch]]:
    """The ``dp * k`` packed micro-batches dealt ``k`` to each replica (the paper's global batch
    is PP_size micro-batches per DP replica, §7.1): heaviest first, each to the least-loaded
    replica with a slot left. A micro-batch the memory cap does not hold as one (the cost
    model's memory need not be additive) is split under ``s_max``."""
    per_group: list[list[MicroBatch]] = [[] for _ in range(dp)]
    kind, uly = cp_attention_kind(cost, sp, cp_layout)
    loads = [float(work[b].sum()) if b else 0.0 for b in bins]
    heap = [(0.0, r) for r in range(dp)]
    slots = [0] * dp
    for b in sorted(range(len(bins)), key=lambda b: (-loads[b], b)):
        if not bins[b]:
            continue
        pending = []
        while True:
            load, r = heapq.heappop(heap)
            if slots[r] < k:
                break
            pending.append((load, r))
        for item in pending:
            heapq.heappush(heap, item)
        members = list(bins[b])
        if microbatch_fits(batch, members, cost, sp, ckpt, "sequence"):
            packs = [tuple(members)]
        else:
            packs = pack_under_budget(batch, members, cost, sp, ckpt, s_max)
        per_group[r].extend(
            MicroBatch(samples=pk, ckpt_layers=ckpt, sp_kind=kind, ulysses_degree=uly)
            for pk in packs
        )
        slots[r] += 1
        heapq.heappush(heap, (load + loads[b], r))
    return per_group
