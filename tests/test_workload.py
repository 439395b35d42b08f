"""Workloads: video grid shapes, Zipf/reweighted mixes, histogram quantile reproduction,
determinism (across calls and processes), the batch policy, length scaling, max-length policy,
statistics against brute-force references, and every workload config composing and building."""

from __future__ import annotations

import hashlib
import json
import math
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import yaml

from dcp_bench.errors import WorkloadError
from dcp_bench.paths import CONF_DIR, REPO_ROOT
from dcp_bench.workloads import (
    DATA_DIR,
    WORKLOADS,
    Workload,
    distribution_stats,
    image_buckets,
    latent_frames,
    load_workload,
    make_workload,
    spatial_patches,
    video_buckets,
    zipf_weights,
)

RAW_DATA = Path("/work/shared/data")
RAW_FILES = {"wikipedia": "wikipedia_flexsp_lengths.txt", "prolong": "prolong_distca_lengths.json"}
BUILDABLE = [n for n in WORKLOADS if n != "lengths_file"]


# ---------------------------------------------------------------------------------------------
# Video grid


def test_spatial_patches_match_the_reference_grid() -> None:
    # The table of patches per frame at each resolution.
    expected = {
        (144, 256): 144,
        (240, 426): 405,
        (360, 640): 920,
        (480, 854): 1590,
        (720, 1280): 3600,
    }
    for (h, w), s in expected.items():
        assert spatial_patches(h, w) == s


def test_latent_frames_and_token_range() -> None:
    assert [latent_frames(f) for f in (1, 51, 102, 204, 408)] == [1, 15, 30, 60, 120]
    buckets = image_buckets() + video_buckets()
    assert len(buckets) == 25 and len(set(buckets)) == 25
    tokens = [b.tokens for b in buckets]
    assert min(tokens) == 144 and max(tokens) == 432_000  # 144p image .. 720p x 408 frames


def test_bucket_orders() -> None:
    heights = [b.height for b in image_buckets()]
    assert heights == sorted(heights)
    keys = [b.frames * b.height for b in video_buckets()]
    assert keys == sorted(keys)


def test_zipf_weights_closed_form() -> None:
    p = zipf_weights(20, alpha=3, offset=5)
    k = np.arange(6, 26)
    ref = (1.0 / k**3) / np.sum(1.0 / k**3)
    np.testing.assert_allclose(p, ref, rtol=1e-12)


def test_videosys_zipf_mix() -> None:
    src = load_workload("videosys_zipf").source
    probs = src.probs  # type: ignore[attr-defined]
    # Images are the first five buckets: their total share is the image count share.
    assert math.isclose(probs[:5].sum(), 100_000 / 102_000, rel_tol=1e-12)
    np.testing.assert_allclose(probs[:5] / probs[:5].sum(), zipf_weights(5), rtol=1e-12)
    np.testing.assert_allclose(probs[5:] / probs[5:].sum(), zipf_weights(20), rtol=1e-12)


def test_balanced_spreads_token_mass_evenly_and_long_is_uniform_by_count() -> None:
    bal = load_workload("videosys_balanced").source
    mass = bal.probs * np.array([b.tokens for b in bal.buckets])  # type: ignore[attr-defined]
    np.testing.assert_allclose(mass / mass.sum(), np.full(25, 1 / 25), rtol=1e-12)
    long_ = load_workload("videosys_long").source
    np.testing.assert_allclose(long_.probs, np.full(25, 1 / 25), rtol=1e-12)  # type: ignore[attr-defined]


def test_video_batches_keep_2d_shapes() -> None:
    w = load_workload("videosys_long")
    batch = w.global_batch(3, 16)
    grid = {(b.latent_frames, b.spatial) for b in image_buckets() + video_buckets()}
    shapes = set(zip(batch.frames.tolist(), batch.spatial.tolist()))
    assert shapes <= grid
    assert np.all(batch.tokens == batch.frames * batch.spatial)
    assert (batch.frames > 1).any()  # long mixes do draw videos


def test_opensora_stage1_buckets_come_from_the_config() -> None:
    w = load_workload("opensora_v12_stage1")
    labels = {b.label for b in w.source.buckets}  # type: ignore[attr-defined]
    assert "144px192f" in labels and "720p image" in labels
    assert "240px128f" not in labels  # keep probability 0 in the config
    assert w.provenance["source"].startswith("hpcaitech/Open-Sora")


# ---------------------------------------------------------------------------------------------
# Histograms of published length lists


@pytest.mark.parametrize("name", ["wikipedia", "prolong"])
def test_histogram_sampling_reproduces_reference_quantiles(name: str) -> None:
    """p10..p99 of a large sample are within 2% of the raw list's quantiles (stored at
    derivation)."""
    w = load_workload(name)
    ref = json.loads((DATA_DIR / f"{name}_histogram.json").read_text())["reference"]
    tokens, _ = w.shapes(w.source.draw(np.random.default_rng(7), 400_000))
    for key, value in ref["quantiles"].items():
        got = np.percentile(tokens, int(key[1:]))
        assert abs(got / value - 1) <= 0.02, (name, key, got, value)
    assert tokens.max() <= ref["max"] and tokens.min() >= ref["min"]


@pytest.mark.parametrize("name", ["wikipedia", "prolong"])
def test_histogram_matches_raw_list_when_available(name: str) -> None:
    raw = RAW_DATA / RAW_FILES[name]
    if not raw.exists():
        pytest.skip(f"{raw} not present")
    from dcp_bench.corpora import read_lengths_file

    lengths = np.asarray(read_lengths_file(raw))
    data = json.loads((DATA_DIR / f"{name}_histogram.json").read_text())
    assert data["provenance"]["source_sha256"] == hashlib.sha256(raw.read_bytes()).hexdigest()
    assert sum(data["counts"]) == len(lengths) == data["reference"]["n"]
    for key, value in data["reference"]["quantiles"].items():
        assert np.percentile(lengths, int(key[1:])) == pytest.approx(value)
    # Each bin's count is the number of raw lengths in [lo, hi).
    lo, hi, counts = (np.asarray(data[k]) for k in ("bin_lo", "bin_hi", "counts"))
    idx = np.searchsorted(lo, lengths, side="right") - 1
    assert np.all(lengths < hi[idx])
    np.testing.assert_array_equal(np.bincount(idx, minlength=len(counts)), counts)


# ---------------------------------------------------------------------------------------------
# Determinism and the batch policy


@pytest.mark.parametrize("name", BUILDABLE)
def test_same_seed_and_step_give_the_same_batch(name: str) -> None:
    a = load_workload(name, seed=3).global_batch(5, 8)
    b = load_workload(name, seed=3).global_batch(5, 8)
    np.testing.assert_array_equal(a.sample_ids, b.sample_ids)
    np.testing.assert_array_equal(a.tokens, b.tokens)
    np.testing.assert_array_equal(a.frames, b.frames)
    assert a.n >= 1


def test_seed_and_step_change_the_batch() -> None:
    w0, w1 = load_workload("prolong", seed=0), load_workload("prolong", seed=1)
    ids = lambda b: b.sample_ids.tolist()  # noqa: E731
    assert ids(w0.global_batch(0, 8)) != ids(w1.global_batch(0, 8))
    assert ids(w0.global_batch(0, 8)) != ids(w0.global_batch(1, 8))


_PROBE = """
import hashlib, sys
from dcp_bench.workloads import load_workload
for name in sys.argv[1:]:
    b = load_workload(name, seed=11).global_batch(4, 16)
    h = hashlib.sha256(b.sample_ids.tobytes() + b.tokens.tobytes() + b.frames.tobytes()).hexdigest()
    print(name, h)
"""


def test_batches_are_identical_in_another_process() -> None:
    names = ["videosys_zipf", "wikipedia", "sharegpt", "synthetic_lognormal"]
    out = subprocess.run(
        [sys.executable, "-c", _PROBE, *names],
        capture_output=True,
        text=True,
        check=True,
        cwd=REPO_ROOT,
    ).stdout.split()
    remote = dict(zip(out[0::2], out[1::2]))
    for name in names:
        b = load_workload(name, seed=11).global_batch(4, 16)
        local = hashlib.sha256(
            b.sample_ids.tobytes() + b.tokens.tobytes() + b.frames.tobytes()
        ).hexdigest()
        assert remote[name] == local, name


@pytest.mark.parametrize("name", ["videosys_zipf", "prolong", "synthetic_uniform"])
def test_token_budget_is_filled_greedily(name: str) -> None:
    """Total <= budget, and the next sample of the same stream would overflow it."""
    w = load_workload(name)
    batch = w.global_batch(2, 4)
    budget = w.token_budget(4)
    assert batch.total_tokens <= budget
    longer = load_workload(name, samples_per_step=batch.n + 1).global_batch(2, 4)
    np.testing.assert_array_equal(longer.sample_ids[: batch.n], batch.sample_ids)
    assert batch.total_tokens + int(longer.tokens[-1]) > budget


def test_budget_grows_with_world_size_and_smaller_batches_are_prefixes() -> None:
    w = load_workload("wikipedia", tokens_per_gpu=32_768)
    small, big = w.global_batch(1, 2), w.global_batch(1, 16)
    assert w.token_budget(16) == 8 * w.token_budget(2) == 16 * 32_768
    assert big.n > small.n
    np.testing.assert_array_equal(big.sample_ids[: small.n], small.sample_ids)


def test_at_least_one_sample_even_over_budget() -> None:
    batch = load_workload("synthetic_fixed", length=65_536, tokens_per_gpu=1).global_batch(0, 1)
    assert batch.n == 1 and batch.total_tokens == 65_536


def test_samples_per_step_fixes_the_count() -> None:
    for world in (1, 8, 64):
        assert load_workload("sharegpt", samples_per_step=37).global_batch(0, world).n == 37


@pytest.mark.parametrize("name", ["videosys_zipf", "prolong", "debian_docs", "synthetic_lognormal"])
def test_sample_ids_identify_their_sizes(name: str) -> None:
    w = load_workload(name)
    batch = w.global_batch(9, 8)
    tokens, frames = w.shapes(batch.sample_ids)
    np.testing.assert_array_equal(tokens, batch.tokens)
    np.testing.assert_array_equal(frames, batch.frames)


def test_list_ids_index_the_fixture() -> None:
    lengths = json.loads((DATA_DIR / "sharegpt_lengths.json").read_text())["lengths"]
    batch = load_workload("sharegpt").global_batch(0, 4)
    assert batch.tokens.tolist() == [lengths[i] for i in batch.sample_ids.tolist()]


# ---------------------------------------------------------------------------------------------
# Length scaling and the max-length policy


def test_length_scale_shrinks_spatial_and_keeps_frames() -> None:
    base, scaled = load_workload("videosys_long"), load_workload("videosys_long", length_scale=64)
    ids = base.global_batch(0, 8).sample_ids
    t0, f0 = base.shapes(ids)
    t1, f1 = scaled.shapes(ids)
    np.testing.assert_array_equal(f1, f0)
    s0 = t0 // f0
    np.testing.assert_array_equal(t1 // f1, np.maximum(1, np.rint(s0 / 64)).astype(np.int64))


def test_length_scale_on_text() -> None:
    base, scaled = load_workload("prolong"), load_workload("prolong", length_scale=100)
    ids = base.global_batch(0, 8).sample_ids
    t0, _ = base.shapes(ids)
    t1, f1 = scaled.shapes(ids)
    assert np.all(f1 == 1)
    np.testing.assert_array_equal(t1, np.maximum(1, np.rint(t0 / 100)).astype(np.int64))
    # The budget shrinks with the scale, so the sample count stays about the same.
    assert scaled.token_budget(8) == base.token_budget(8) // 100


def test_truncate_policy_caps_lengths_and_counts() -> None:
    w = load_workload("prolong", max_len_policy="truncate")
    batch = w.global_batch(0, 8, max_seq_len=4096)
    raw, _ = w.shapes(batch.sample_ids)
    assert batch.tokens.max() <= 4096
    assert batch.truncated == int(np.sum(raw > 4096)) > 0
    np.testing.assert_array_equal(batch.tokens, np.minimum(raw, 4096))
    assert batch.dropped == 0


def test_truncating_video_drops_whole_latent_frames() -> None:
    w = load_workload("videosys_long")
    batch = w.global_batch(0, 8, max_seq_len=50_000)
    raw_tokens, raw_frames = w.shapes(batch.sample_ids)
    raw_spatial = raw_tokens // raw_frames
    cut = raw_tokens > 50_000
    assert cut.any() and batch.truncated == int(cut.sum())
    np.testing.assert_array_equal(batch.spatial[cut], raw_spatial[cut])
    np.testing.assert_array_equal(batch.frames[cut], 50_000 // raw_spatial[cut])
    assert batch.tokens.max() <= 50_000


def test_drop_policy_skips_over_long_samples_in_stream_order() -> None:
    limit, k = 2048, 200
    stream = load_workload("prolong", samples_per_step=2000).global_batch(6, 1)
    keep = stream.tokens <= limit
    dropped_before = int(np.sum(~keep[: np.nonzero(keep)[0][k - 1]]))
    batch = load_workload(
        "prolong", samples_per_step=k, max_len=limit, max_len_policy="drop"
    ).global_batch(6, 1)
    np.testing.assert_array_equal(batch.sample_ids, stream.sample_ids[keep][:k])
    assert batch.dropped == dropped_before > 0 and batch.truncated == 0


def test_max_len_param_and_model_limit_combine() -> None:
    w = load_workload("prolong", max_len=3000)
    assert w.global_batch(0, 8, max_seq_len=10_000).tokens.max() <= 3000
    assert w.global_batch(0, 8, max_seq_len=1000).tokens.max() <= 1000


def test_drop_everything_is_an_error() -> None:
    w = load_workload("synthetic_fixed", length=4096, max_len=100, max_len_policy="drop")
    with pytest.raises(WorkloadError, match="max_len=100"):
        w.global_batch(0, 1)


# ---------------------------------------------------------------------------------------------
# Synthetic controls and statistics


def test_synthetic_controls() -> None:
    fixed = load_workload("synthetic_fixed").global_batch(0, 4)
    assert set(fixed.tokens.tolist()) == {65_536}
    uni = load_workload("synthetic_uniform", low=100, high=200, samples_per_step=5000).global_batch(
        0, 1
    )
    assert uni.tokens.min() >= 100 and uni.tokens.max() <= 200
    assert abs(uni.tokens.mean() - 150) < 2
    logn = load_workload(
        "synthetic_lognormal", median=1000, sigma=0.5, samples_per_step=20000
    ).global_batch(0, 1)
    assert abs(np.median(logn.tokens) / 1000 - 1) < 0.03
    for name in ("synthetic_fixed", "synthetic_uniform", "synthetic_lognormal"):
        w = load_workload(name)
        assert w.kind == "synthetic" and "synthetic" in w.provenance["source"]


def _brute_stats(lengths: np.ndarray) -> dict[str, float]:
    v = lengths.astype(np.float64)
    out = {"mean": v.mean(), "max": v.max()}
    for k in (8, 32, 128):
        longer = v > k * 1024
        out[f"token_share_gt_{k}k"] = v[longer].sum() / v.sum()
        out[f"attn_share_gt_{k}k"] = (v[longer] ** 2).sum() / (v**2).sum()
    for q in (10, 25, 50, 75, 90, 99):
        out[f"p{q}"] = np.percentile(v, q)
    return out


@pytest.mark.parametrize("name", ["sharegpt", "debian_docs"])
def test_list_stats_are_exact(name: str) -> None:
    lengths = np.asarray(json.loads((DATA_DIR / f"{name}_lengths.json").read_text())["lengths"])
    stats = load_workload(name).stats()
    assert stats["n"] == len(lengths) and stats["stats_method"] == "exact"
    for key, value in _brute_stats(lengths).items():
        assert stats[key] == pytest.approx(value, rel=1e-9), key


@pytest.mark.parametrize("name", ["videosys_balanced", "videosys_long"])
def test_grid_stats_match_an_expanded_population(name: str) -> None:
    """Exact grid statistics equal those of a population with the bucket counts the weights imply;
    quantiles of a bucket distribution are bucket sizes (inverse CDF, no interpolation)."""
    w = load_workload(name)
    tokens = np.array([b.tokens for b in w.source.buckets])  # type: ignore[attr-defined]
    counts = np.rint(w.source.probs * 4e6).astype(np.int64)  # type: ignore[attr-defined]
    pop = np.repeat(tokens, counts)
    stats = w.stats()
    ref = _brute_stats(pop)
    for key in ("mean", "max", "token_share_gt_32k", "attn_share_gt_128k"):
        assert stats[key] == pytest.approx(ref[key], rel=2e-3), key
    for q in (10, 50, 90, 99):
        assert stats[f"p{q}"] in set(tokens.tolist())
        # Lower quantile of the population: the value at rank ceil(q * N).
        assert stats[f"p{q}"] == np.sort(pop)[math.ceil(q / 100 * len(pop)) - 1]


def test_distribution_stats_on_a_tiny_case() -> None:
    s = distribution_stats(np.array([1000.0, 10_000.0, 200_000.0]), np.array([1.0, 1.0, 1.0]))
    total = 211_000.0
    assert s["token_share_gt_8k"] == pytest.approx(210_000 / total)
    assert s["token_share_gt_128k"] == pytest.approx(200_000 / total)
    assert s["attn_share_gt_32k"] == pytest.approx(200_000**2 / (1e6 + 1e8 + 4e10))


def test_stats_keys() -> None:
    keys = {"n", "mean", "p10", "p25", "p50", "p75", "p90", "p99", "max"}
    keys |= {f"{a}_share_gt_{k}k" for a in ("token", "attn") for k in (8, 32, 128)}
    assert keys <= set(load_workload("synthetic_uniform").stats())


# ---------------------------------------------------------------------------------------------
# Interface, errors and configs


@pytest.mark.parametrize("name", BUILDABLE)
def test_workload_interface(name: str) -> None:
    w = load_workload(name)
    assert isinstance(w, Workload) and w.name == name and w.version
    assert w.kind in ("video", "text", "synthetic")
    assert w.default_model == ("stdit3_xl2" if w.kind == "video" else "llama3_8b")
    assert isinstance(w.provenance, dict) and w.provenance


@pytest.mark.parametrize(
    ("params", "match"),
    [
        ({"seed": -1}, "seed"),
        ({"seed": 1.5}, "seed"),
        ({"length_scale": 0.5}, "length_scale"),
        ({"length_scale": "big"}, "length_scale"),
        ({"max_len_policy": "clip"}, "max_len_policy"),
        ({"max_len": 0}, "max_len"),
        ({"tokens_per_gpu": 0}, "tokens_per_gpu"),
        ({"samples_per_step": 0}, "samples_per_step"),
        ({"colour": "blue"}, "unknown parameter"),
    ],
)
def test_bad_parameters(params: dict, match: str) -> None:
    with pytest.raises(WorkloadError, match=match):
        load_workload("prolong", **params)


def test_unknown_workload_names_the_choices() -> None:
    with pytest.raises(WorkloadError, match="valid names: videosys_zipf"):
        load_workload("imagenet")


def test_bad_synthetic_parameters() -> None:
    with pytest.raises(WorkloadError, match="low <= high"):
        load_workload("synthetic_uniform", low=10, high=5)
    with pytest.raises(WorkloadError, match="sigma"):
        load_workload("synthetic_lognormal", sigma=-1)


def test_every_workload_config_composes_and_builds(tmp_path: Path) -> None:
    from dcp_bench.config import instantiate, load_config

    lengths = tmp_path / "lengths.txt"
    lengths.write_text("10\n20\n30\n")
    names = sorted(p.stem for p in (CONF_DIR / "workload").glob("*.yaml"))
    # every named workload has its config; the others build their own class (FlexSP's corpus
    # iterations), reading a file where it lies
    own = {
        n: yaml.safe_load((CONF_DIR / "workload" / f"{n}.yaml").read_text())
        for n in set(names) - set(WORKLOADS)
    }
    assert set(WORKLOADS) <= set(names)
    assert own and all(c["_target_"] != "dcp_bench.workloads.load_workload" for c in own.values())
    for name in names:
        extra = [f"workload.lengths_file={lengths}"] if name == "lengths_file" else []
        cfg = load_config([f"workload={name}", *extra])
        if name in own and not Path(own[name]["lengths_file"]).is_file():
            with pytest.raises(WorkloadError, match=own[name]["lengths_file"]):
                make_workload(cfg.workload)
            continue
        # a class of its own carries listing keys (kind, description) that make_workload reads
        built = [make_workload(cfg.workload)]
        if name not in own:
            built.append(instantiate(cfg.workload))
        world = int(own[name]["world_size"]) if name in own else 2  # FlexSP's: read for its world
        for w in built:
            assert w.name == name
            assert w.global_batch(0, world).n >= 1


def test_default_config_uses_videosys_zipf() -> None:
    from dcp_bench.config import load_config

    assert make_workload(load_config([]).workload).name == "videosys_zipf"


def test_make_workload_refuses_targets_that_are_not_workloads() -> None:
    with pytest.raises(WorkloadError, match="_target_ 'os.system' could not be built"):
        make_workload({"_target_": "os.system", "name": "prolong"})
    with pytest.raises(WorkloadError, match="global_batch"):
        make_workload({"_target_": "collections.OrderedDict"})
