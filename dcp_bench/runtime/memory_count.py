"""Activation memory counted from the runtime's own models (`dcp_bench.runtime.models`).

`count_activations` builds a model of a `ModelSpec` at its full width (fewer layers: every layer
of a model is the same), runs one forward over a micro-batch and counts, per unit of the model,
the bytes autograd keeps for the backward:

- every tensor handed to a ``torch.autograd.graph.saved_tensors_hooks`` pack hook, once per
  storage (views and tensors saved by several ops share a storage and count once), parameters
  excluded (they are training states, not activations);
- with checkpointing, the inputs each checkpointed unit keeps for its recomputation (the unit's
  tensor arguments: non-reentrant checkpointing keeps them and saves nothing inside the unit).

The forward runs under ``torch._subclasses.fake_tensor.FakeTensorMode`` on the CPU device: shapes,
dtypes, storages and the operators' dispatch are real, no data is computed or allocated, so
Llama-3-8B and STDiT3-XL/2 count at full width on a laptop. Attention is the CPU fused flash
kernel (SDPA restricted to its fused backends): it saves q, k, v, its output and the fp32
log-sum-exp per head and row, as fused kernels on a GPU do, never the n x n score matrix; every
count records the attention backward nodes it saw and `count_activations` fails if a saved
tensor has a square attention-length shape above 64 keys (a math-path score matrix where a
fused kernel should run). STDiT3 self-attention over fewer than 30 keys runs the math path on
purpose, as the reference does (`runtime.models.STDiTBlock`): its small score matrices count.

A unit is the part of the model an op runs in: the module section entered last (the layer's
sub-modules map to sections: norm and adaLN modulation, self-attention, cross-attention, MLP), the
embeddings before the first layer and the final layer / loss after the last. Tokens are per rank
at SP degree 1; with sequence parallelism the per-token terms divide by the degree while
per-sample terms (caption K/V) are replicated.
"""

from __future__ import annotations

import dataclasses
from collections import defaultdict
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from torch import Tensor, nn
from torch._subclasses.fake_tensor import FakeTensorMode

from dcp_bench.cost import make_cost_model
from dcp_bench.cost.specs import ModelSpec, model_spec
from dcp_bench.errors import ConfigError
from dcp_bench.runtime.archs import RuntimeArch, runtime_arch
from dcp_bench.runtime.attention import SINGLE, AttentionKernel
from dcp_bench.runtime.models import build_empty_model

DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}


@dataclass(frozen=True)
class CountedMemory:
    """Counted activation bytes of one micro-batch, by unit (summed over the counted layers)."""

    model: str
    tokens: int
    frames: int
    samples: int
    layers: int  # layer units counted (pairs for STDiT)
    checkpoint: bool
    units: dict[str, float]
    attention_nodes: tuple[str, ...]

    @property
    def total(self) -> float:
        return float(sum(self.units.values()))

    def layer_units(self, index: int) -> dict[str, float]:
        """Units of layer ``index`` (names without the ``L<i>.`` prefix)."""
        prefix = f"L{index}."
        return {k[len(prefix) :]: v for k, v in self.units.items() if k.startswith(prefix)}

    def by_unit(self) -> dict[str, float]:
        """Per-layer units as the last layer keeps them (nothing shared is first seen there);
        ``shared``: what the first layers keep beyond that (inputs every layer reads, kept once)
        plus the conditioning the checkpoints hold; the model's outer units as they are."""
        last = self.layer_units(self.layers - 1)
        layered = sum(v for k, v in self.units.items() if k.startswith("L"))
        out = {f"layer.{k}": v for k, v in sorted(last.items()) if v}
        out["shared"] = (
            layered - self.layers * sum(last.values()) + self.units.get("conditioning_held", 0.0)
        )
        for k, v in sorted(self.units.items()):
            if not k.startswith("L") and k != "conditioning_held" and v:
                out[k] = v
        return out


class _Tracker:
    """Attributes every kept storage to the unit it was first kept in."""

    def __init__(self, params: set[int]) -> None:
        self.params = params
        self.seen: set[int] = set()
        self.units: dict[str, float] = defaultdict(float)
        self.unit = "embeddings"
        self.attention_nodes: set[str] = set()
        self.square: list[tuple[int, ...]] = []

        self.where: dict[int, tuple[str, float]] = {}
        # storages first kept since the last unit change: a checkpoint saves its inputs just
        # before the unit starts, while the previous unit is still current
        self.recent: set[int] = set()

    def set_unit(self, unit: str) -> None:
        self.unit = unit
        self.recent = set()

    def keep(self, t: Tensor, unit: str | None = None) -> None:
        st = t.untyped_storage()
        key = st._cdata
        if key in self.params:
            return
        if key in self.seen:
            if unit is not None and key in self.recent:  # re-attribute a checkpoint's saved input
                old, nbytes = self.where[key]
                self.units[old] -= nbytes
                self.units[unit] += nbytes
                self.where[key] = (unit, nbytes)
                self.recent.discard(key)
            return
        self.seen.add(key)
        nbytes = float(st.nbytes())
        self.units[unit or self.unit] += nbytes
        self.where[key] = (unit or self.unit, nbytes)
        if unit is None:
            self.recent.add(key)

    def pack(self, t: Tensor) -> Tensor:
        fn = type(t.grad_fn).__name__ if t.grad_fn is not None else ""
        if "Attention" in fn:
            self.attention_nodes.add(fn)
        if t.untyped_storage()._cdata in self.params:
            return t
        if t.dim() >= 3 and t.shape[-1] == t.shape[-2] and t.shape[-1] > 64:
            self.square.append(tuple(t.shape))
        self.keep(t)
        return t


def _section_hooks(model: nn.Module, tracker: _Tracker, entry: RuntimeArch) -> list[Any]:
    """Forward pre-hooks that set the tracker's current unit (the architecture's runtime entry
    maps sub-modules to units, `dcp_bench.runtime.archs`)."""
    handles = []

    def setter(name: str) -> Any:
        def hook(mod: nn.Module, args: Any) -> None:
            tracker.set_unit(name)

        return hook

    for name, mod in model.named_modules():
        unit = entry.section_of(name.split("."))
        if unit is not None:
            handles.append(mod.register_forward_pre_hook(setter(unit)))
    for mod, before, after in entry.final_units(model):
        handles.append(mod.register_forward_pre_hook(setter(before)))
        if after is not None:
            handles.append(mod.register_forward_hook(lambda m, a, o, u=after: tracker.set_unit(u)))
    return handles


def _checkpoint_input_hooks(
    model: nn.Module, tracker: _Tracker, entry: RuntimeArch, layers: int
) -> list[Any]:
    """Pre-hooks on the checkpointed units that record the inputs their recomputation keeps."""
    handles = []

    def recorder(unit: str) -> Any:
        def hook(mod: nn.Module, args: Any) -> None:
            tensors = [a for a in args if isinstance(a, Tensor)]
            tensors += [x for a in args if isinstance(a, tuple) for x in a if isinstance(x, Tensor)]
            if tensors:
                tracker.keep(tensors[0], f"{unit}.checkpoint_input")
            for a in tensors[1:]:  # modulation, caption features, RoPE tables: shared by every unit
                tracker.keep(a, "conditioning_held")
            tracker.recent = set()

        return hook

    for unit, mod in entry.checkpoint_units(model, layers):
        handles.append(mod.register_forward_pre_hook(recorder(unit)))
    return handles


def _fake_inputs(mode: Any, inputs: Any) -> Any:
    fields = {}
    for f in dataclasses.fields(inputs):
        v = getattr(inputs, f.name)
        if isinstance(v, Tensor):
            v = mode.from_tensor(v)
        elif isinstance(v, tuple) and v and all(isinstance(x, Tensor) for x in v):
            v = tuple(mode.from_tensor(x) for x in v)
        fields[f.name] = v
    return type(inputs)(**fields)


def count_activations(
    spec: ModelSpec,
    tokens: list[int],
    frames: list[int] | None = None,
    checkpoint: bool = False,
    layers: int = 2,
    dtype: str | None = None,
) -> CountedMemory:
    """Count what autograd keeps for one micro-batch of samples of ``tokens`` (and ``frames`` per
    sample for video) on a ``layers``-layer model of ``spec``'s width, every layer checkpointed
    or none. See the module docstring."""
    if layers < 1:
        raise ConfigError(f"layers={layers}: expected >= 1")
    if not tokens or min(tokens) < 1:
        raise ConfigError(f"tokens={tokens}: expected one or more positive token counts")
    fr = list(frames) if frames is not None else [1] * len(tokens)
    if len(fr) != len(tokens) or any(n % f for n, f in zip(tokens, fr)):
        raise ConfigError(
            f"frames={fr}: expected one per sample, each dividing its tokens {tokens}"
        )
    torch_dtype = DTYPES.get(dtype or spec.dtype)
    if torch_dtype is None:
        raise ConfigError(f"dtype={dtype or spec.dtype!r}; expected one of {sorted(DTYPES)}")
    small = dataclasses.replace(spec, num_layers=layers)
    entry = runtime_arch(small)
    ids = np.arange(len(tokens))
    mode = FakeTensorMode(allow_non_fake_inputs=False)
    cpu = torch.device("cpu")
    previous = torch.get_default_dtype()
    try:  # parameters are fake (shapes only), created in the compute dtype
        torch.set_default_dtype(torch_dtype)
        with mode, torch.no_grad():
            model = entry.build(small)
    finally:
        torch.set_default_dtype(previous)
    # Inputs are built for real (small: latents, ids, captions), then converted to fake tensors.
    model.set_attention(
        AttentionKernel("sdpa", fused_only=True, notes=["memory count: fused SDPA only"])
    )
    real_model_for_inputs = build_empty_model(dataclasses.replace(small, num_layers=1)).to_empty(
        device=cpu
    )
    with torch.no_grad():
        inputs = real_model_for_inputs.make_inputs(
            ids, np.asarray(tokens), np.asarray(fr), SINGLE, 0
        )
    fake_in = _fake_inputs(mode, inputs)
    params = {p.untyped_storage()._cdata for p in model.parameters()}
    tracker = _Tracker(params)
    handles = _section_hooks(model, tracker, entry)
    if checkpoint:
        handles += _checkpoint_input_hooks(model, tracker, entry, layers)
    try:
        with mode, torch.autograd.graph.saved_tensors_hooks(tracker.pack, lambda t: t):
            loss = model(fake_in, SINGLE, layers if checkpoint else 0)
            del loss
    finally:
        for h in handles:
            h.remove()
    if tracker.square:
        raise RuntimeError(
            f"a saved tensor of square shape {tracker.square[0]}: attention took a non-fused path"
        )
    return CountedMemory(
        model=spec.name,
        tokens=int(sum(tokens)),
        frames=int(sum(fr)),
        samples=len(tokens),
        layers=layers,
        checkpoint=checkpoint,
        units=dict(tracker.units),
        attention_nodes=tuple(sorted(tracker.attention_nodes)),
    )


__all__ = ["CountedMemory", "count_activations"]


# ------------------------------------------------------------------------------------------------
# The memory table: counted bytes beside the cost model's, unit by unit

# The cases `dcp-bench memory` counts by default: (model, per-sample tokens, per-sample frames).
DEFAULT_CASES: tuple[tuple[str, tuple[int, ...], tuple[int, ...] | None], ...] = (
    ("stdit3_xl2", (256,), (1,)),  # one 256-patch image (the reference's 144p-ish image bucket)
    ("stdit3_xl2", (1024,), (1,)),
    ("stdit3_xl2", (256,) * 8, (1,) * 8),  # eight images packed: the per-sample terms
    ("stdit3_xl2", (4096,), (4,)),
    ("stdit3_xl2", (16384,), (16,)),
    ("llama3_8b", (1024,), None),
    ("llama3_8b", (4096,), None),
    ("llama3_8b", (1024,) * 4, None),
    ("llama3_8b", (16384,), None),
    ("gpt_7b", (1024,), None),  # FlexSP's GPT (learned positions: within its 2048-row table)
    ("gpt_7b", (1024,) * 2, None),
)


def compare_units(
    counted: CountedMemory, breakdown: dict[str, float], num_layers: int
) -> dict[str, tuple[float, float]]:
    """unit -> (counted bytes, model bytes) of one micro-batch: per-layer units for ONE layer
    (the model's stored-layer units divided by the stored layers; its checkpoint inputs by the
    checkpointed layers), what is kept once (``shared``), the outer units, and ``total`` over a
    model of ``num_layers`` layers (the counted layers extrapolated: every layer is the same)."""
    units = counted.by_unit()
    k = num_layers if counted.checkpoint else 0
    out: dict[str, tuple[float, float]] = {}
    ckpt_counted = 0.0
    for u, v in units.items():
        if u.startswith("layer.") and u.endswith(".checkpoint_input"):
            ckpt_counted += v
        elif u.startswith("layer."):
            out[u] = (v, breakdown.get(u, 0.0) / max(num_layers - k, 1))
    if counted.checkpoint:
        out["layer.checkpoint_inputs"] = (
            ckpt_counted,
            breakdown.get("checkpoint_inputs", 0.0) / num_layers,
        )
    for u, v in units.items():
        if not u.startswith("layer."):
            out[u] = (v, breakdown.get(u, 0.0))
    per_layer = sum(v for u, v in units.items() if u.startswith("layer."))
    rest = sum(v for u, v in units.items() if not u.startswith("layer."))
    out["total"] = (rest + num_layers * per_layer, float(sum(breakdown.values())))
    return out


def memory_table(
    cases: Any = DEFAULT_CASES, layers: int = 2, cluster: str = "h200x32"
) -> list[dict[str, Any]]:
    """Rows (model, tokens, samples, frames, checkpoint, unit, counted_bytes, model_bytes,
    rel_err): for each case and checkpoint setting, the bytes counted from the runtime's model
    (`count_activations`, ``layers`` full-width layers) beside the analytical cost model's
    (`AnalyticalCostModel.activation_breakdown`) for the full-depth model."""
    rows: list[dict[str, Any]] = []
    for name, toks, frs in cases:
        spec = model_spec(name)
        cost = make_cost_model(spec, cluster, "analytical")
        for ckpt in (False, True):
            counted = count_activations(
                spec, list(toks), list(frs) if frs else None, checkpoint=ckpt, layers=layers
            )
            k = spec.num_layers if ckpt else 0
            breakdown = cost.activation_breakdown(  # type: ignore[attr-defined]
                list(toks), float(len(toks)), 1, k, frames=list(frs or [1] * len(toks))
            )
            for unit, (c, m) in compare_units(counted, breakdown, spec.num_layers).items():
                rows.append(
                    {
                        "model": name,
                        "tokens": int(sum(toks)),
                        "samples": len(toks),
                        "frames": int(sum(frs or [1] * len(toks))),
                        "checkpoint": "every layer" if ckpt else "none",
                        "unit": unit,
                        "counted_bytes": int(round(c)),
                        "model_bytes": int(round(m)),
                        "rel_err": (m / c - 1.0) if c else (0.0 if m == 0 else float("inf")),
                        "attention": ",".join(counted.attention_nodes) or "-",
                    }
                )
    return rows


__all__ += ["DEFAULT_CASES", "compare_units", "memory_table"]
