"""Hardware, cluster and model specs. Every constant lives in a config file beside its source
(``dcp_bench/conf/gpu``, ``conf/cluster``, ``conf/model``); these dataclasses validate them."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any

import yaml

from dcp_bench.archs import get_arch
from dcp_bench.cost.constants import ASSUMED_CONSTANTS, OPTIONAL_CONSTANTS
from dcp_bench.cost.library_specs import library_spec_fields
from dcp_bench.errors import ClusterError, ConfigError
from dcp_bench.layout import aligned_sp_degrees
from dcp_bench.paths import CONF_DIR


@dataclass(frozen=True)
class GPUSpec:
    name: str
    peak_flops: float  # dense bf16 FLOP/s (datasheet)
    matmul_flops: float  # bf16 FLOP/s reached by a large matmul (measured where stated)
    mem_bytes: float  # HBM capacity
    usable_mem_bytes: float  # what a framework can allocate
    mem_bw: float  # bytes/s (datasheet)
    measured_mem_bw: float  # bytes/s (measured where stated)
    sources: dict[str, str] = field(default_factory=dict)
    # Memory the framework holds besides tensors the model owns: CUDA context, NCCL buffers,
    # allocator fragmentation, kernel workspaces (an assumption per GPU; see docs/cost_model.md).
    workspace_bytes: float = 3.0 * 2**30
    # Analytical cost constants calibrated for this GPU (keys of
    # dcp_bench.cost.analytical.ASSUMED_CONSTANTS), each with its source in ``sources``.
    cost_constants: dict[str, float] = field(default_factory=dict)


@dataclass(frozen=True)
class ClusterSpec:
    name: str
    gpu: GPUSpec
    num_nodes: int
    gpus_per_node: int
    intra_node_bw: float  # bytes/s per GPU, each way (NVLink)
    inter_node_bw: float  # bytes/s per GPU, each way (network)
    intra_node_latency_s: float
    inter_node_latency_s: float
    profile: str | None = None  # a measured profile artifact (results/...) when one exists
    sources: dict[str, str] = field(default_factory=dict)
    # Analytical cost constants calibrated for this cluster's links (a2a_eff, a2a_latency_s,
    # allreduce_eff), each with its source in ``sources``; they take precedence over the GPU's.
    cost_constants: dict[str, float] = field(default_factory=dict)
    # Ranks that all run on one machine (the `cpu` cluster of gloo ranks): a resized world is one
    # node of any size (6 ranks = one node of 6), not whole nodes of ``gpus_per_node``.
    single_machine: bool = False

    def __post_init__(self) -> None:
        if self.num_nodes < 1 or self.gpus_per_node < 1:
            raise ClusterError(
                f"cluster {self.name!r}: num_nodes={self.num_nodes} and gpus_per_node="
                f"{self.gpus_per_node} must both be >= 1"
            )
        if self.num_nodes > 1 and self.gpus_per_node & (self.gpus_per_node - 1):
            # Aligned power-of-two groups would straddle nodes of, say, 6 GPUs (ranks 4..7).
            raise ClusterError(
                f"cluster {self.name!r}: gpus_per_node={self.gpus_per_node} on {self.num_nodes} "
                "nodes; expected a power of two per node when there are several nodes (aligned "
                "sequence-parallel groups of 1, 2, 4, ... must not straddle nodes)"
            )

    @property
    def world_size(self) -> int:
        return self.num_nodes * self.gpus_per_node

    def sp_degrees(self) -> list[int]:
        """The SP degrees an aligned group layout supports on this cluster: the powers of two that
        divide the world size (any number of nodes: 3 nodes of 8 GPUs have degrees 1 .. 8)."""
        return aligned_sp_degrees(self.world_size)

    def resized(self, world_size: int) -> ClusterSpec:
        """The same hardware with ``world_size`` ranks: one node when it fits in one (or the
        cluster is `single_machine`), else whole nodes (any number of them). The name says the size
        when it changes (``cpu@2``), so records and reports never mix a resized cluster with the
        original."""
        if world_size == self.world_size:
            return self
        if world_size < 1:
            raise ClusterError(f"cluster {self.name!r}: world size {world_size}; expected >= 1")
        base = self.name.split("@", 1)[0]
        if world_size <= self.gpus_per_node or self.single_machine:
            return dataclasses.replace(
                self, name=f"{base}@{world_size}", num_nodes=1, gpus_per_node=world_size
            )
        if world_size % self.gpus_per_node:
            raise ClusterError(
                f"cluster {self.name!r}: {world_size} GPUs do not fill whole nodes of "
                f"{self.gpus_per_node} GPUs; expected at most {self.gpus_per_node} or a multiple "
                "of it"
            )
        return dataclasses.replace(
            self, name=f"{base}@{world_size}", num_nodes=world_size // self.gpus_per_node
        )


@dataclass(frozen=True)
class ModelSpec:
    name: str
    arch: str  # a registered architecture (`dcp_bench.archs`): llama, gpt, stdit, wan, ...
    num_layers: int  # decoders: layers; stdit: spatial+temporal block pairs; wan: blocks
    hidden: int
    heads: int
    kv_heads: int
    ffn_hidden: int
    vocab: int = 0  # llama only
    max_seq_len: int = 1 << 20
    tie_embeddings: bool = False
    in_channels: int = 4  # stdit: latent channels
    patch: tuple[int, int, int] = (1, 2, 2)  # stdit: (t, h, w)
    text_tokens: int = 0  # stdit: caption tokens, attended by cross-attention
    text_dim: int = 0  # stdit: caption embedding width (T5)
    dtype: str = "bf16"
    sources: dict[str, str] = field(default_factory=dict)
    qkv_bias: bool = False  # llama: q/k/v projections with bias (Qwen2)
    # stdit: the per-head q/k RMSNorm, a cost option: "reference" (the fallback the reference
    # runs without apex, keeping an fp32 copy of q and k) or "fused" (apex's FusedRMSNorm: the
    # input and an fp32 rstd per row). dcp_bench.cost.activations.QK_NORMS; docs/cost_model.md.
    qk_norm: str = "reference"
    # A model of another library (``transformers``): the spec was derived from its config
    # (`dcp_bench.cost.library_specs`), which the runtime builds the model from.
    library: str = ""
    library_config: dict[str, Any] = field(default_factory=dict)
    # Decoder options (`dcp_bench.archs.llama`; the defaults are Llama's): the attention head
    # width when it is not hidden / heads (0: hidden / heads; Gemma, Qwen3), per-head or
    # full-width q/k norms ("" none, "head": Qwen3, Gemma3, "full": OLMo2), the norm
    # ("rmsnorm" | "layernorm", with bias), the MLP ("swiglu" | "geglu" gated, "gelu" plain),
    # a bias on every linear layer (GPT-NeoX, GPT), norms per layer (Gemma2/3: 4).
    head_dim_override: int = 0
    qk_head_norm: str = ""
    norm: str = "rmsnorm"
    mlp: str = "swiglu"
    linear_bias: bool = False
    norms_per_layer: int = 2
    learned_positions: int = 0  # rows of a learned position table (GPT); 0: rotary positions

    def __post_init__(self) -> None:
        # num_layers may be 0 here: the profiler builds a model without layers to measure the rest
        # (a run's config is held to >= 1 where it is parsed, `dcp_bench.run.spec`)
        for key in ("num_layers", "hidden", "heads", "kv_heads", "ffn_hidden"):
            value = getattr(self, key)
            least = 0 if key == "num_layers" else 1
            if isinstance(value, bool) or not isinstance(value, int) or value < least:
                raise ConfigError(
                    f"model.{key}={value!r} (model {self.name!r}): expected an integer >= {least}"
                )
        arch = get_arch(self.arch)  # a one-line error naming the registered ones
        for key, allowed in (
            ("qk_head_norm", ("", "head", "full")),
            ("norm", ("rmsnorm", "layernorm")),
            ("mlp", ("swiglu", "geglu", "gelu")),
        ):
            if getattr(self, key) not in allowed:
                raise ConfigError(
                    f"model.{key}={getattr(self, key)!r} (model {self.name!r}): expected one of "
                    f"{', '.join(map(repr, allowed))}"
                )
        if self.qk_norm not in ("reference", "fused"):
            raise ConfigError(
                f"model.qk_norm={self.qk_norm!r} (model {self.name!r}): expected 'reference' "
                "(the reference's fallback RMSNorm) or 'fused'"
            )
        if self.heads % self.kv_heads:
            raise ConfigError(
                f"model {self.name!r}: heads {self.heads} not a multiple of kv_heads "
                f"{self.kv_heads}"
            )
        arch.check(self)

    @property
    def head_dim(self) -> int:
        return get_arch(self.arch).head_dim(self)

    def sp_degree_offence(self, sp: int) -> str | None:
        """Why this model cannot run a sequence-split micro-batch on ``sp`` ranks, or None (its
        architecture's rule, `dcp_bench.archs.base.Architecture.sp_degree_offence`)."""
        return get_arch(self.arch).sp_degree_offence(self, sp)

    @property
    def dtype_bytes(self) -> int:
        return {"bf16": 2, "fp16": 2, "fp32": 4}[self.dtype]


# The decoder options ModelSpec gained with the architecture registry, at the values every model
# had before: a run's identity leaves them out at these values, so earlier run ids stay the same.
DECODER_OPTION_DEFAULTS: dict[str, Any] = {
    "head_dim_override": 0,
    "qk_head_norm": "",
    "norm": "rmsnorm",
    "mlp": "swiglu",
    "linear_bias": False,
    "norms_per_layer": 2,
    "learned_positions": 0,
}


def model_identity(model: ModelSpec) -> dict[str, Any]:
    """The model's fields as a run's identity hashes them (`DECODER_OPTION_DEFAULTS` left out at
    their defaults)."""
    return {
        k: v
        for k, v in dataclasses.asdict(model).items()
        if not (k in DECODER_OPTION_DEFAULTS and v == DECODER_OPTION_DEFAULTS[k])
    }


def runnable_sp_degrees(model: ModelSpec, world_size: int) -> list[int]:
    """The SP degrees a plan may give a sequence-split group: the aligned degrees of the world
    (powers of two dividing it) that the model's attention heads divide. Being powers of two,
    they are a prefix of the aligned degrees: 1, 2, ... up to the largest power of two dividing
    both the world size and the head count (12 heads on 32 GPUs: 1, 2, 4)."""
    return [d for d in aligned_sp_degrees(world_size) if model.sp_degree_offence(d) is None]


def describe_sp_degrees(model: ModelSpec, world_size: int) -> str:
    """The runnable degrees in words, for errors: "1, 2, 4 (powers of two dividing both 32 GPUs
    and the model's 12 attention heads)"."""
    degrees = runnable_sp_degrees(model, world_size)
    return (
        f"{', '.join(map(str, degrees))} (powers of two dividing both {world_size} GPUs and "
        f"the {model.heads} attention heads of model {model.name!r})"
    )


def _read_yaml(group: str, name: str) -> dict[str, Any]:
    path = CONF_DIR / group / f"{name}.yaml"
    if not path.exists():
        choices = sorted(p.stem for p in (CONF_DIR / group).glob("*.yaml"))
        kind = {"gpu": "GPU"}.get(group, group)
        raise (
            ClusterError(f"unknown {kind} {name!r}; valid choices: {', '.join(choices)}")
            if group
            in (
                "gpu",
                "cluster",
            )
            else ConfigError(f"unknown {group} {name!r}; valid choices: {', '.join(choices)}")
        )
    data = yaml.safe_load(path.read_text()) or {}
    return {k: v for k, v in data.items() if not k.startswith("_")}


def _build(cls: type, data: dict[str, Any]) -> Any:
    names = {f.name for f in dataclasses.fields(cls)}
    unknown = set(data) - names
    if unknown:
        raise ConfigError(f"{cls.__name__}: unknown fields {sorted(unknown)}")
    return cls(**data)


def _check_constants(consts: dict[str, Any], owner: str) -> None:
    unknown = set(consts) - set(ASSUMED_CONSTANTS) - set(OPTIONAL_CONSTANTS)
    if unknown:
        raise ConfigError(
            f"{owner}: unknown cost_constants {sorted(unknown)}; expected keys of "
            f"{sorted([*ASSUMED_CONSTANTS, *OPTIONAL_CONSTANTS])}"
        )


def gpu_spec(name: str) -> GPUSpec:
    data = _read_yaml("gpu", name)
    if "cost_constants" in data:
        data["cost_constants"] = dict(data["cost_constants"])
        _check_constants(data["cost_constants"], f"GPU {name!r}")
    return _build(GPUSpec, data)


def cluster_spec(name: str, **fields: Any) -> ClusterSpec:
    """A cluster by config name (``cluster_spec("h200x32")``) or from its fields (what hydra's
    ``_target_`` passes)."""
    data = {"name": name, **fields} if fields else _read_yaml("cluster", name)
    data = {k: v for k, v in data.items() if not k.startswith("_")}
    gpu = data.pop("gpu")
    if isinstance(gpu, str):
        data["gpu"] = gpu_spec(gpu)
    else:
        gdata = dict(gpu)
        for key in ("sources", "cost_constants"):
            if key in gdata:
                gdata[key] = dict(gdata[key])
        data["gpu"] = _build(GPUSpec, gdata)
    for key in ("sources", "cost_constants"):
        if key in data:
            data[key] = dict(data[key])
    _check_constants(data.get("cost_constants", {}), f"cluster {data.get('name')!r}")
    return _build(ClusterSpec, data)


def model_spec(name: str, **fields: Any) -> ModelSpec:
    """A model by config name (``model_spec("llama3_8b")``) or from its fields."""
    data = {"name": name, **fields} if fields else _read_yaml("model", name)
    data = {k: v for k, v in data.items() if not k.startswith("_")}
    if "config" in data or "config_file" in data:  # a library's own config (model=hf)
        return _build(ModelSpec, library_spec_fields(data))
    if "patch" in data:
        data["patch"] = tuple(data["patch"])
    for key in ("sources", "library_config"):
        if key in data:
            data[key] = dict(data[key])
    return _build(ModelSpec, data)
