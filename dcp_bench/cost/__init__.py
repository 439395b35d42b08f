"""Hardware, cluster and model specs; the cost and memory model (analytical and profiled).

`make_cost_model` is the one way to build a cost model: planners, baselines, the simulator and the
runner all call it, so a profiled source replaces the analytical one everywhere at once.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from dcp_bench.config import to_container
from dcp_bench.cost.analytical import AnalyticalCostModel
from dcp_bench.cost.base import DEFAULT_MEM_CAP_FRACTION, CostModel, MicroBatchCost
from dcp_bench.cost.flexsp_fitted import FlexSPFittedCostModel
from dcp_bench.cost.params import param_breakdown, param_count
from dcp_bench.cost.profiled import ProfiledCostModel
from dcp_bench.cost.specs import ClusterSpec, ModelSpec, cluster_spec, model_spec
from dcp_bench.errors import ConfigError

SOURCES = ("analytical", "profiled", "auto", "flexsp_fitted")

__all__ = [
    "DEFAULT_MEM_CAP_FRACTION",
    "SOURCES",
    "CostModel",
    "MicroBatchCost",
    "make_cost_model",
    "param_breakdown",
    "param_count",
    "resolve_cluster",
    "resolve_model",
]


def resolve_model(model: ModelSpec | str | Mapping[str, Any] | Any) -> ModelSpec:
    """A `ModelSpec` from a spec, a config name, or a config node (``cfg.model``)."""
    if isinstance(model, ModelSpec):
        return model
    if isinstance(model, str):
        return model_spec(model)
    data = {k: v for k, v in to_container(model).items() if not k.startswith("_")}
    return model_spec(data.pop("name"), **data)


def resolve_cluster(cluster: ClusterSpec | str | Mapping[str, Any] | Any) -> ClusterSpec:
    """A `ClusterSpec` from a spec, a config name, or a config node (``cfg.cluster``)."""
    if isinstance(cluster, ClusterSpec):
        return cluster
    if isinstance(cluster, str):
        return cluster_spec(cluster)
    data = {k: v for k, v in to_container(cluster).items() if not k.startswith("_")}
    return cluster_spec(data.pop("name"), **data)


def make_cost_model(
    model: ModelSpec | str | Any,
    cluster: ClusterSpec | str | Any,
    source: str = "analytical",
    mem_cap_fraction: float = DEFAULT_MEM_CAP_FRACTION,
    profile: str | Path | None = None,
    scales: Mapping[str, float] | None = None,
    **options: Any,
) -> CostModel:
    """Build the cost model of ``model`` on ``cluster``.

    ``source``: ``"analytical"``; ``"profiled"`` (the tables in ``profile``, or the cluster's own
    ``ClusterSpec.profile``); ``"auto"`` (profiled when a profile is given or the cluster names
    one, analytical otherwise; when the cluster's own profile cannot serve this model, e.g. it was
    measured for another model, analytical with the reason in ``provenance["auto_fallback"]``);
    ``"flexsp_fitted"`` (FlexSP's own fitted model, `dcp_bench.cost.flexsp_fitted`).
    ``scales`` multiplies uncertain analytical constants for sensitivity studies (keys act_bytes,
    attn_eff, small_kernel_eff, a2a_eff). ``options`` go to the model's constructor (e.g.
    ``zero_stage=2`` for the analytical source).
    """
    if source not in SOURCES:
        raise ConfigError(f"unknown cost source {source!r}; valid choices: {', '.join(SOURCES)}")
    mspec, cspec = resolve_model(model), resolve_cluster(cluster)
    if source == "flexsp_fitted":
        if scales or profile is not None:
            raise ConfigError(
                "cost source 'flexsp_fitted' takes FlexSP's own constants; scales and profile "
                "apply to the analytical and profiled sources only"
            )
        return FlexSPFittedCostModel(model=mspec, cluster=cspec, **options)
    profile_path = profile if profile is not None else cspec.profile
    fallback = None
    if source == "auto" and profile is None and profile_path and not scales:
        try:
            return make_cost_model(
                mspec, cspec, "profiled", mem_cap_fraction, profile_path, None, **options
            )
        except ConfigError as exc:
            fallback = f"cluster profile {profile_path!s} not used: {exc}"
    if source == "auto":
        source = "profiled" if profile_path and fallback is None else "analytical"
    if source == "profiled":
        if not profile_path:
            raise ConfigError(
                f"cost source 'profiled' needs a profile: cluster {cspec.name!r} names none; pass "
                "profile=PATH (written by `dcp-bench profile`) or use source='analytical'"
            )
        if scales:
            raise ConfigError(
                f"cost scales {sorted(scales)} apply to the analytical source only; the profiled "
                "source uses measured times"
            )
        return ProfiledCostModel(
            model=mspec,
            cluster=cspec,
            mem_cap_fraction=mem_cap_fraction,
            profile=str(profile_path),
            **options,
        )
    return AnalyticalCostModel(
        model=mspec,
        cluster=cspec,
        mem_cap_fraction=mem_cap_fraction,
        scales=dict(scales or {}),
        provenance={"auto_fallback": fallback} if fallback else {},
        **options,
    )
