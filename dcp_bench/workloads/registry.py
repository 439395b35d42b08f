"""The named workloads (`WORKLOADS`), each a size-source builder, a default model and a version;
`load_workload` builds one by name, `make_workload` from a ``workload`` config node."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from dcp_bench.config import instantiate, to_container
from dcp_bench.errors import WorkloadError
from dcp_bench.workloads.base import SizeSource
from dcp_bench.workloads.histogram import histogram_source
from dcp_bench.workloads.lengths import fixture_source, lengths_file_source
from dcp_bench.workloads.synthetic import synthetic_source
from dcp_bench.workloads.video import (
    ReferenceDataset,
    mix_dataset,
    mix_source,
    opensora_stage1_source,
    reweighted_source,
    zipf_source,
)
from dcp_bench.workloads.workload import Workload

# The ``_target_`` of a workload config built from this registry. Configs written before the
# workloads package (the shipped ones among them, and every committed run record) spell it
# ``dcp_bench.workload.load_workload``: both spellings name the registry.
REGISTRY_TARGET = "dcp_bench.workloads.load_workload"
LEGACY_REGISTRY_TARGET = "dcp_bench.workload.load_workload"
REGISTRY_TARGETS = (REGISTRY_TARGET, LEGACY_REGISTRY_TARGET)

POLICY_PARAMS = (
    "seed",
    "tokens_per_gpu",
    "samples_per_step",
    "length_scale",
    "max_len",
    "max_len_policy",
)
# What a workload config may say about its data, for records and reports: a one-line
# description, where the data comes from, and under which licence it may be used.
PROVENANCE_PARAMS = ("description", "source", "licence")


@dataclass(frozen=True)
class WorkloadEntry:
    kind: str
    default_model: str
    description: str
    build: Callable[..., tuple[SizeSource, dict[str, Any]]]
    params: tuple[str, ...] = ()  # source parameters besides the batch-policy ones
    version: str = "1"
    dataset: Callable[..., ReferenceDataset] | None = None  # the fixed dataset of run.unit=epoch
    dataset_params: tuple[str, ...] = ()  # its parameters (also accepted as workload parameters)


VIDEO_MODEL, TEXT_MODEL = "stdit3_xl2", "llama3_8b"

WORKLOADS: Mapping[str, WorkloadEntry] = {
    "videosys_zipf": WorkloadEntry(
        "video",
        VIDEO_MODEL,
        "reference video grid, Zipf(3, offset 5) mix of 100,000 images and 2,000 videos",
        lambda **p: zipf_source(**p),
        ("population_images", "population_videos", "alpha", "offset"),
        dataset=lambda **p: mix_dataset("videosys_zipf", **p),
        dataset_params=("data_size", "data_seed"),
    ),
    "videosys_mix_balanced": WorkloadEntry(
        "video",
        VIDEO_MODEL,
        "the project's balanced mix: reference generator, uniform buckets, 100,000 images "
        "+ 2,000 videos (images ~48% of tokens)",
        lambda **p: mix_source("videosys_mix_balanced", **p),
        ("data_size", "data_seed"),
        dataset=lambda **p: mix_dataset("videosys_mix_balanced", **p),
        dataset_params=("data_size", "data_seed"),
    ),
    "videosys_mix_long": WorkloadEntry(
        "video",
        VIDEO_MODEL,
        "the project's long mix: reference generator, uniform buckets, inclusive mixing "
        "(400 images + 1,600 videos; videos >99% of tokens)",
        lambda **p: mix_source("videosys_mix_long", **p),
        ("data_size", "data_seed"),
        dataset=lambda **p: mix_dataset("videosys_mix_long", **p),
        dataset_params=("data_size", "data_seed"),
    ),
    "videosys_balanced": WorkloadEntry(
        "video",
        VIDEO_MODEL,
        "reference video grid, equal token mass per bucket",
        lambda: reweighted_source("balanced"),
    ),
    "videosys_long": WorkloadEntry(
        "video",
        VIDEO_MODEL,
        "reference video grid, uniform over buckets (long buckets dominate tokens)",
        lambda: reweighted_source("long"),
    ),
    "opensora_v12_stage1": WorkloadEntry(
        "video",
        VIDEO_MODEL,
        "Open-Sora v1.2 stage-1 bucket config (keep probabilities) on the grid",
        opensora_stage1_source,
    ),
    "wikipedia": WorkloadEntry(
        "text",
        TEXT_MODEL,
        "Wikipedia document lengths (FlexSP list, 1,000,000 docs), histogram",
        lambda: histogram_source("wikipedia"),
    ),
    "prolong": WorkloadEntry(
        "text",
        TEXT_MODEL,
        "ProLong document lengths (DistCA list, 77,932 docs), histogram",
        lambda: histogram_source("prolong"),
    ),
    "sharegpt": WorkloadEntry(
        "text",
        TEXT_MODEL,
        "ShareGPT V3 conversations, cl100k tokens (derived fixture)",
        lambda: fixture_source("sharegpt"),
    ),
    "debian_docs": WorkloadEntry(
        "text",
        TEXT_MODEL,
        "Debian documentation packages, cl100k tokens (derived fixture)",
        lambda: fixture_source("debian_docs"),
    ),
    "lengths_file": WorkloadEntry(
        "text",
        TEXT_MODEL,
        "the user's lengths file or text dataset (workload.lengths_file=PATH)",
        lengths_file_source,
        ("path", "lengths_file", "column", "tokenizer", "text_field"),
    ),
    "synthetic_fixed": WorkloadEntry(
        "synthetic",
        TEXT_MODEL,
        "synthetic control: every sample the same length (default 64K)",
        lambda **p: synthetic_source("fixed", **p),
        ("length",),
    ),
    "synthetic_uniform": WorkloadEntry(
        "synthetic",
        TEXT_MODEL,
        "synthetic control: uniform lengths (default 1K..64K)",
        lambda **p: synthetic_source("uniform", **p),
        ("low", "high"),
    ),
    "synthetic_lognormal": WorkloadEntry(
        "synthetic",
        TEXT_MODEL,
        "synthetic control: lognormal lengths (default median 4K, sigma 1.2)",
        lambda **p: synthetic_source("lognormal", **p),
        ("median", "sigma", "low", "high"),
    ),
}


def load_workload(name: str, **params: Any) -> Workload:
    """Build a named workload. Batch-policy parameters: ``seed``, ``tokens_per_gpu``,
    ``samples_per_step``, ``length_scale``, ``max_len``, ``max_len_policy``; plus the source's own
    (e.g. ``lengths_file=PATH`` for ``lengths_file``). Unknown names or parameters raise
    `WorkloadError` naming the valid ones."""
    entry = WORKLOADS.get(name)
    if entry is None:
        raise WorkloadError(f"unknown workload {name!r}; valid names: {', '.join(WORKLOADS)}")
    params = {k: v for k, v in params.items() if v is not None or k in POLICY_PARAMS}
    valid = tuple(
        dict.fromkeys(POLICY_PARAMS + PROVENANCE_PARAMS + entry.params + entry.dataset_params)
    )
    unknown = sorted(set(params) - set(valid) - {"default_model"})
    if unknown:
        raise WorkloadError(
            f"workload {name!r}: unknown parameter(s) {', '.join(unknown)}; valid: "
            f"{', '.join(valid)}"
        )
    for key in entry.dataset_params:
        if key in params:
            params[key] = _as_int(params[key], name, key)
    source_params = {k: params[k] for k in entry.params if k in params}
    source, prov = entry.build(**source_params)
    dataset = None
    if entry.dataset is not None:
        dataset = entry.dataset(**{k: params[k] for k in entry.dataset_params if k in params})
    policy = {k: params[k] for k in POLICY_PARAMS if params.get(k) is not None}
    for key in ("seed", "tokens_per_gpu", "samples_per_step", "max_len"):
        if key in policy:
            policy[key] = _as_int(policy[key], name, key)
    if "length_scale" in policy:
        try:
            policy["length_scale"] = float(policy["length_scale"])
        except (TypeError, ValueError):
            raise WorkloadError(
                f"workload {name!r}: length_scale {policy['length_scale']!r} is not a number"
            ) from None
    if source_params:
        prov = {
            **prov,
            "params": {k: v for k, v in source_params.items() if k not in ("path", "lengths_file")},
        }
    # The config's own words about its data replace the loader's generic ones.
    prov.update({k: str(params[k]) for k in ("source", "licence") if params.get(k) is not None})
    return Workload(
        name=name,
        kind=entry.kind,
        source=source,
        version=entry.version,
        default_model=str(params.get("default_model") or entry.default_model),
        provenance=prov,
        description=str(params.get("description") or entry.description),
        dataset=dataset,
        **policy,
    )


def _as_int(value: Any, name: str, key: str) -> int:
    if isinstance(value, bool):
        raise WorkloadError(f"workload {name!r}: {key} {value!r} is not an integer")
    try:
        f = float(value)
    except (TypeError, ValueError):
        raise WorkloadError(f"workload {name!r}: {key} {value!r} is not an integer") from None
    if not f.is_integer():
        raise WorkloadError(f"workload {name!r}: {key} {value!r} is not an integer")
    return int(f)


def make_workload(node: Any, seed: int | None = None) -> Any:
    """Build the workload a ``workload`` config node describes, its global batches seeded by
    ``seed`` (the run's seed). A node whose ``_target_`` is `load_workload` (`REGISTRY_TARGETS`:
    either spelling), or that has none, names a registered workload; any other ``_target_`` is a
    user's class, built with the node's parameters and ``seed``, which must provide
    ``global_batch(step, world_size, max_seq_len)``."""
    if isinstance(node, str):
        return load_workload(node, **({"seed": seed} if seed is not None else {}))
    data = to_container(node)
    if seed is not None:
        data["seed"] = seed
    target = data.pop("_target_", None)
    if target is not None and target not in REGISTRY_TARGETS:
        said = {k: data.pop(k) for k in PROVENANCE_PARAMS if data.get(k) is not None}
        try:
            built = instantiate(
                {"_target_": target, **{k: v for k, v in data.items() if k != "kind"}}
            )
        except WorkloadError:
            raise
        except Exception as exc:  # an import error, a refused or failing constructor: one line
            first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
            raise WorkloadError(
                f"workload _target_ {target!r} could not be built: {first}"
            ) from None
        if not callable(getattr(built, "global_batch", None)):
            raise WorkloadError(
                f"workload {target!r} has no global_batch(step, world_size, max_seq_len) method"
            )
        if isinstance(getattr(built, "provenance", None), dict):
            built.provenance.update({k: str(v) for k, v in said.items() if k != "description"})
        return built
    data.pop("kind", None)
    name = data.pop("name", None)
    if not name:
        raise WorkloadError("workload config has no name")
    return load_workload(str(name), **data)
