"""Workloads: sources of sample sizes plus a global-batch policy, turned into `GlobalBatch` es.

This package is the code; the repository's top-level ``workloads/`` folder
(`dcp_bench.paths.WORKLOADS_DIR`) is the data it reads (derived histograms and length lists, their
provenance README).

Modules, by source kind:

- `base`: limits and sample-id layout, `check_length`, the abstract `SizeSource`, statistics
helpers;
- `video`: the Open-Sora v1.2 / STDiT3 bucket grid, the reference's dummy dataset and the video
mixes;
- `histogram`: a histogram of a published length list;
- `lengths`: a finite length list (a derived fixture, a user's lengths file or text dataset);
- `synthetic`: labelled synthetic length distributions;
- `workload`: `Workload`, a size source plus the batch policy (how a step's batch is dealt);
- `registry`: the named workloads, `load_workload` and `make_workload`;
- `catalog`: the workload configs as ``dcp-bench workloads`` lists, loads and deals them.

``from dcp_bench.workloads import load_workload`` is the usual entry point.
"""

from dcp_bench.workloads.base import (
    DATA_DIR,
    MAX_SAMPLE_TOKENS,
    SizeSource,
    check_length,
    distribution_stats,
    weighted_quantile,
)
from dcp_bench.workloads.histogram import HistogramSource
from dcp_bench.workloads.lengths import ListSource
from dcp_bench.workloads.registry import (
    LEGACY_REGISTRY_TARGET,
    REGISTRY_TARGET,
    REGISTRY_TARGETS,
    WORKLOADS,
    WorkloadEntry,
    load_workload,
    make_workload,
)
from dcp_bench.workloads.synthetic import SyntheticSource
from dcp_bench.workloads.video import (
    BucketSource,
    ReferenceDataset,
    VideoBucket,
    image_buckets,
    latent_frames,
    latent_voxels,
    spatial_patches,
    video_buckets,
    zipf_weights,
)
from dcp_bench.workloads.workload import Workload

__all__ = [
    "DATA_DIR",
    "LEGACY_REGISTRY_TARGET",
    "MAX_SAMPLE_TOKENS",
    "REGISTRY_TARGET",
    "REGISTRY_TARGETS",
    "WORKLOADS",
    "BucketSource",
    "HistogramSource",
    "ListSource",
    "ReferenceDataset",
    "SizeSource",
    "SyntheticSource",
    "VideoBucket",
    "Workload",
    "WorkloadEntry",
    "check_length",
    "distribution_stats",
    "image_buckets",
    "latent_frames",
    "latent_voxels",
    "load_workload",
    "make_workload",
    "spatial_patches",
    "video_buckets",
    "weighted_quantile",
    "zipf_weights",
]
