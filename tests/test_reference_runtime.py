"""The reference runtime's rules (dcp_bench.reference), each against a small example worked out by
hand from the reference's code (docs/reference_semantics.md names the file and line of every
rule), and the epoch loop's accounting: every sample of the dataset is trained at most once, and
the ones that are not are counted by the reason the reference drops them."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import pytest

from dcp_bench.config import load_config, to_container
from dcp_bench.errors import ConfigError
from dcp_bench.reference import run_label, unit_of_label
from dcp_bench.reference.epoch import dataset_buckets, iteration_plan
from dcp_bench.reference.samplers import (
    Bucket,
    accumulation_counts,
    bucket_epoch,
    dcp_inter_epoch,
    dcp_intra_epoch,
    draw_sp,
)
from dcp_bench.reference.trial_search import (
    BucketProfile,
    ProfileRow,
    Trial,
    baseline_search,
    damp_to_median,
    dcp_search,
    fewest_ckpt_fitting,
)
from dcp_bench.run.simulated import run_simulated
from dcp_bench.run.spec import parse_run_spec
from dcp_bench.workloads import ReferenceDataset, load_workload

GIB = 2.0**30


class ScriptedRng:
    """A numpy-Generator stand-in whose draws follow a script: ``random()`` and ``integers(n)``
    return the scripted values in order (then fall back to a seeded generator); the i-th call of
    ``permutation`` returns the i-th scripted permutation (None, or none left: the identity)."""

    def __init__(
        self,
        uniforms: list[float] | None = None,
        ints: list[int] | None = None,
        perms: list[list[int] | None] | None = None,
    ) -> None:
        self.uniforms = list(uniforms or [])
        self.ints = list(ints or [])
        self.perms = list(perms or [])
        self.fallback = np.random.default_rng(0)

    def random(self) -> float:
        return self.uniforms.pop(0) if self.uniforms else float(self.fallback.random())

    def integers(self, n: int) -> int:
        return self.ints.pop(0) if self.ints else int(self.fallback.integers(n))

    def permutation(self, n: int) -> np.ndarray:
        perm = self.perms.pop(0) if self.perms else None
        return np.asarray(range(n) if perm is None else perm, dtype=np.int64)


def table_measure(
    fits: Callable[[int, int], bool], times: Callable[[int, int], float], log: list | None = None
):
    def measure(sp: int, bs: int) -> Trial:
        if log is not None:
            log.append((sp, bs))
        return Trial(fits(sp, bs), times(sp, bs), 0.0, 28)

    return measure


# -------------------------------------------------------------------------------------------------
# The dataset generator (E1)


def test_reference_dataset_counts_match_the_hand_computation() -> None:
    buckets, counts = ReferenceDataset().counts()
    by_label = dict(zip((b.label for b in buckets), counts.tolist()))
    # Images: k^-3 for k = 6..10, normalised, x 100,000, rounded (the sum is exact).
    assert [by_label[f"{r} image"] for r in ("144p", "240p", "360p", "480p", "720p")] == [
        39003,
        24562,
        16454,
        11556,
        8425,
    ]
    videos = [
        "144px51f",
        "240px51f",
        "144px102f",
        "360px51f",
        "240px102f",
        "480px51f",
        "144px204f",
        "360px102f",
        "720px51f",
        "240px204f",
        "480px102f",
        "144px408f",
        "360px204f",
        "720px102f",
        "240px408f",
        "480px204f",
        "360px408f",
        "720px204f",
        "480px408f",
        "720px408f",
    ]
    assert [by_label[v] for v in videos] == [
        592,
        373,
        250,
        176,
        128,
        96,
        74,
        58,
        47,
        38,
        31,
        26,
        22,
        19,
        16,
        14,
        12,
        11,
        9,
        8,
    ]
    assert int(counts.sum()) == 102_000


def test_reference_dataset_mixing_rules() -> None:
    inclusive = ReferenceDataset(
        distribution="uniform", image_mixing_type="inclusive", image_mixing_frac=-1
    )
    assert inclusive.sizes() == (
        400,
        1600,
    )  # images get their share of the 25 candidates: 5/25 of 2,000
    assert ReferenceDataset(image_mixing_type="inclusive", image_mixing_frac=0.25).sizes() == (
        500,
        1500,
    )
    assert ReferenceDataset(image_mixing_frac=3).sizes() == (6000, 2000)  # exclusive: images on top
    # Uniform counts are the generator's own draws: seeded data_seed + data_size, images first.
    rng = np.random.default_rng(42 + 2000)
    img = np.bincount(rng.integers(0, 5, size=400), minlength=5)
    vid = np.bincount(rng.integers(0, 20, size=1600), minlength=20)
    assert inclusive.counts()[1].tolist() == [*img.tolist(), *vid.tolist()]
    with pytest.raises(Exception, match="exclusive mixing needs >= 0"):
        ReferenceDataset(image_mixing_frac=-1)


def test_mix_workloads_have_their_datasets_and_the_short_mix_is_videosys_zipf() -> None:
    zipf = load_workload("videosys_zipf")
    ds = zipf.epoch_dataset(32)
    assert ds.n == 102_000 and int((ds.frames == 1).sum()) == 100_000
    lat = zipf.latent_tokens(ds.sample_ids)
    assert lat is not None and float(lat[ds.frames == 1].sum() / lat.sum()) == pytest.approx(
        0.708, abs=1e-3
    )
    assert load_workload("videosys_mix_long").epoch_dataset(8).n == 2000
    with pytest.raises(Exception, match="no fixed dataset"):
        load_workload("videosys_balanced").epoch_dataset(8)


# -------------------------------------------------------------------------------------------------
# The profiler (E2, E3, E8)


def test_baseline_search_powers_of_two_and_throughput_guard() -> None:
    cap = 98 * GIB
    log: list = []
    m = table_measure(
        lambda sp, bs: (10 + 7 * bs) * GIB <= cap,
        lambda sp, bs: {4: 1.0, 8: 1.8}.get(bs, 0.3 * bs),
        log,
    )
    p = baseline_search(m, 4)
    assert p is not None and (p.bs, p.time_s) == (8, 1.8)
    assert log == [
        (4, 1),
        (4, 2),
        (4, 4),
        (4, 8),
        (4, 16),
    ]  # powers of two, the first failure ends it
    slow = table_measure(
        lambda sp, bs: (10 + 7 * bs) * GIB <= cap, lambda sp, bs: {4: 1.0, 8: 4.5}.get(bs, 0.3 * bs)
    )
    p = baseline_search(slow, 4)
    assert p is not None and (p.bs, p.time_s) == (4, 1.0)  # 1.0 / 0.444 > 2: the smaller batch wins
    one = baseline_search(
        table_measure(lambda sp, bs: (10 + 50 * bs) * GIB <= cap, lambda sp, bs: 1.0), 4
    )
    assert one is not None and one.bs == 1  # a single success is kept (ambiguity A1)
    assert (
        baseline_search(
            table_measure(lambda sp, bs: (100 + bs) * GIB <= cap, lambda sp, bs: 1.0), 4
        )
        is None
    )
    big = baseline_search(table_measure(lambda sp, bs: bs <= 700, lambda sp, bs: float(bs)), 4)
    assert big is not None and big.bs == 512  # no cap; 700 fitting gives the power of two below


def test_median_damping_by_hand() -> None:
    def prof(bs: int, t: float) -> BucketProfile:
        return BucketProfile(4, bs, t, 28)

    out = damp_to_median(
        {
            "A": prof(8, 2.0),
            "B": prof(4, 3.0),
            "C": prof(2, 6.0),
            "D": prof(1, 10.0),
            "E": prof(16, 1.0),
        }
    )
    assert {k: (v.bs, v.time_s) for k, v in out.items()} == {
        "A": (8, 2.0),
        "B": (4, 3.0),
        "C": (1, 3.0),
        "D": (1, 10.0),
        "E": (16, 1.0),
    }
    even = damp_to_median(
        {"P": prof(8, 1.0), "Q": prof(8, 2.0), "R": prof(4, 4.0), "S": prof(2, 8.0)}
    )
    assert {k: (v.bs, v.time_s) for k, v in even.items()} == {
        "P": (8, 1.0),
        "Q": (8, 2.0),
        "R": (3, 3.0),
        "S": (1, 4.0),
    }


E8_TIMES = {
    1: {1: 1.1, 2: 2.0, 4: 3.9, 8: 8.0},
    2: {4: 4.4, 8: 8.6, 16: 16.8},
    4: {8: 4.6, 16: 8.8, 32: 17.2},
    8: {16: 4.8, 32: 9.2, 64: 18.0},
}


def e8_measure(log: list) -> Callable[[int, int], Trial]:
    return table_measure(
        lambda sp, bs: bs <= 8 * sp, lambda sp, bs: E8_TIMES.get(sp, {}).get(bs, 1.2 * bs / sp), log
    )


def test_dcp_search_restarts_and_candidates_by_variant() -> None:
    log: list = []
    intra = dcp_search(e8_measure(log), 8, 32, "intra")
    assert intra is not None and (intra.sp, intra.bs) == (1, 8)
    # SP 2 restarts at 16 // 4 = 4, SP 4 at 8, SP 8 at 16; every degree ends at its first failure.
    assert log == [
        (1, 1),
        (1, 2),
        (1, 4),
        (1, 8),
        (1, 16),
        (2, 4),
        (2, 8),
        (2, 16),
        (2, 32),
        (4, 8),
        (4, 16),
        (4, 32),
        (4, 64),
        (8, 16),
        (8, 32),
        (8, 64),
        (8, 128),
    ]
    assert {sp: (r.bs, r.time_s) for sp, r in intra.detail.items()} == {
        1: (8, 8.0),
        2: (16, 16.8),
        4: (32, 17.2),
        8: (64, 18.0),
    }
    inter = dcp_search(e8_measure([]), 8, 32, "inter")
    assert inter is not None and (inter.sp, inter.bs) == (
        1,
        4,
    )  # every success is a candidate: 4 / 3.9 wins
    pac_log: list = []
    dcp_search(e8_measure(pac_log), 8, 32, "pac")
    assert (2, 1) in pac_log and (4, 1) in pac_log  # PAC restarts every degree at batch size 1


def test_dcp_search_goes_across_nodes_only_when_nothing_fits_inside() -> None:
    log: list = []
    p = dcp_search(table_measure(lambda sp, bs: bs <= sp // 16, lambda sp, bs: 1.0), 8, 64, "inter")
    assert p is not None and p.sp == 16 and (32, 1) not in log
    assert (
        dcp_search(table_measure(lambda sp, bs: False, lambda sp, bs: 1.0), 8, 32, "inter") is None
    )


def test_fewest_checkpointed_layers_by_bisection() -> None:
    mem = [100, 90, 80, 70, 60, 50]  # k = 0..5
    assert fewest_ckpt_fitting(lambda k: mem[k], 5, 75) == 3
    assert fewest_ckpt_fitting(lambda k: mem[k], 5, 100) == 0
    assert fewest_ckpt_fitting(lambda k: mem[k], 5, 50) == 5


# -------------------------------------------------------------------------------------------------
# SP draws (E5) and accumulation counts (E6)


def draw_frequencies(rule: str, counts: list[int], n: int = 600) -> list[float]:
    rng = ScriptedRng(uniforms=[(i + 0.5) / n for i in range(n)])
    hits = [0] * len(counts)
    for _ in range(n):
        hits[draw_sp(rule, counts, rng)] += 1  # type: ignore[arg-type]
    return [h / n for h in hits]


def test_sp_draw_probabilities_by_hand() -> None:
    # Live buckets per degree {1: 3, 2: 1, 4: 2}.
    assert draw_frequencies("categorical", [3, 1, 2]) == pytest.approx(
        [0.5, 1 / 6, 1 / 3], abs=1e-9
    )
    assert draw_frequencies("threshold", [3, 1, 2]) == pytest.approx([0.5, 0.0, 0.5], abs=1e-9)
    assert draw_frequencies("threshold", [2, 3, 5]) == pytest.approx([0.2, 0.1, 0.7], abs=1e-9)
    assert draw_frequencies("threshold", [1, 1]) == pytest.approx([0.5, 0.5], abs=1e-9)
    assert draw_frequencies("largest", [3, 1, 2]) == [0.0, 0.0, 1.0]


@pytest.mark.parametrize(
    "times, mx, mn, expect",
    [
        ([1.0, 10.0], 5, 2, [10, 1]),
        ([1.0, 10.0], 5, 15, [20, 2]),
        ([2.0, 2.0], 5, 2, [2, 2]),
        ([3.0, 4.0], 5, 2, [4, 3]),
        ([4.0, 3.0], 5, 2, [3, 4]),
        ([3.0, 4.0], 2, 1, [1, 1]),
        ([1.5, 4.0, 4.0], 5, 2, [8, 3, 3]),
        ([0.5, 2.0], 3, 2, [4, 1]),
    ],
)
def test_accumulation_counts_literal_by_hand(
    times: list[float], mx: int, mn: int, expect: list[int]
) -> None:
    assert accumulation_counts(times, mx, mn, "literal") == expect


def loop_counts(times: list[float], max_steps: int, min_steps: int) -> list[int]:
    """The reference's search written as its plain loops (an independent check of the vectorised
    one)."""

    def score(new: float, target: float) -> float:
        return (new - target) * 1.2 if new > target else (target - new) * 1

    horizon = max(times) * max_steps
    best, best_diff = None, float("inf")
    for t_out in times:
        for mult in range(1, int(horizon / t_out) + 1):
            target = t_out * mult
            if target > horizon:
                break
            counts, total = [], 0.0
            for t in times:
                g_best, d_best = None, float("inf")
                for g in range(1, int(horizon / t) + 1):
                    if t * g > horizon:
                        break
                    d = score(t * g, target)
                    if d < d_best:
                        g_best, d_best = g, d
                total += d_best
                counts.append(g_best)
            if total < best_diff:
                best, best_diff = counts, total
    assert best is not None
    if max(best) < min_steps:
        best = [g * -(-min_steps // max(best)) for g in best]
    return best


def test_accumulation_counts_match_the_reference_loops_on_random_groups() -> None:
    rng = np.random.default_rng(7)
    for _ in range(300):
        n = int(rng.integers(1, 12))
        times = [float(x) for x in np.round(rng.uniform(0.1, 10.0, n), int(rng.integers(1, 4)))]
        mx, mn = int(rng.integers(1, 6)), int(rng.integers(1, 16))
        assert accumulation_counts(times, mx, mn) == loop_counts(times, mx, mn), (times, mx, mn)


def test_accumulation_counts_per_group_reading() -> None:
    assert accumulation_counts([1.0, 10.0], 2, 1, "per_group") == [2, 1]
    assert accumulation_counts([1.0, 10.0], 5, 2, "per_group") == [5, 2]


# -------------------------------------------------------------------------------------------------
# The samplers (E4, E7, ejection)


def profiles(**spec: tuple[int, int, float]) -> dict[str, BucketProfile]:
    return {k: BucketProfile(sp, bs, t, 28) for k, (sp, bs, t) in spec.items()}


def test_bucket_sampler_deal_order_by_hand() -> None:
    buckets = [Bucket("A", [0, 1, 2, 3, 4]), Bucket("B", [5, 6, 7]), Bucket("C", [8, 9])]
    prof = profiles(A=(4, 2, 1.0), B=(4, 3, 1.0), C=(4, 4, 1.0))
    deal = bucket_epoch(buckets, prof, 4, 2, ScriptedRng())  # identity shuffles: access [A, A, B]
    assert [[(g.bucket, g.positions) for g in it] for it in deal.iterations] == [
        [("A", [[0, 1]]), ("A", [[2, 3]])]
    ]
    assert deal.dropped == {"unprofiled": 0, "bucket_remainder": 3, "access_remainder": 3}
    # Shuffles in order: A's list, B's list, C's (empty) list, then the access list -> [B, A, A].
    deal = bucket_epoch(buckets, prof, 4, 2, ScriptedRng(perms=[None, None, None, [2, 0, 1]]))
    assert [[(g.bucket, g.positions) for g in it] for it in deal.iterations] == [
        [("B", [[5, 6, 7]]), ("A", [[0, 1]])]
    ]
    assert deal.dropped["access_remainder"] == 2 and deal.trained == 5


def e7_profiles() -> dict[str, BucketProfile]:
    def detail(rows: dict[int, tuple[int, float]]) -> dict[int, ProfileRow]:
        return {sp: ProfileRow(sp, bs, t, 28) for sp, (bs, t) in rows.items()}

    return {
        "X": BucketProfile(4, 2, 4.0, 28, detail({4: (2, 4.0), 8: (4, 4.5)})),
        "Y": BucketProfile(2, 8, 2.0, 28, detail({2: (8, 2.0), 4: (16, 2.5), 8: (32, 3.0)})),
        "Z": BucketProfile(2, 4, 3.0, 28, detail({2: (4, 3.0), 4: (8, 3.5), 8: (16, 4.0)})),
    }


def test_dcp_intra_iteration_by_hand() -> None:
    buckets = [
        Bucket("X", list(range(0, 12))),
        Bucket("Y", list(range(12, 40))),
        Bucket("Z", list(range(40, 64))),
    ]
    # Fill: SP 4 (u = 0.9 over weights [2, 1]) -> X; SP 2 -> Y (index 0); SP 2 -> Z (index 1).
    rng = ScriptedRng(uniforms=[0.9, 0.1, 0.1], ints=[0, 0, 1])
    deal = dcp_intra_epoch(buckets, e7_profiles(), 8, 8, rng)
    first = deal.iterations[0]
    assert [(g.bucket, g.sp, g.sizes, g.time_s) for g in first] == [
        ("X", 4, [1], 2.0),
        ("Z", 4, [8], 3.5),
    ]
    assert first[0].positions == [[0]] and first[1].positions == [list(range(40, 48))]
    # Y went back whole; nothing of X, Y, Z is trained twice, and what is not trained is counted.
    every = [p for it in deal.iterations for g in it for mb in g.positions for p in mb]
    assert len(every) == len(set(every)) == deal.trained
    assert deal.trained + sum(deal.dropped.values()) == 64


def test_dcp_intra_without_second_pass_keeps_pass_one_sizes() -> None:
    buckets = [
        Bucket("X", list(range(0, 12))),
        Bucket("Y", list(range(12, 40))),
        Bucket("Z", list(range(40, 64))),
    ]
    rng = ScriptedRng(uniforms=[0.9, 0.1, 0.1], ints=[0, 0, 1])
    deal = dcp_intra_epoch(buckets, e7_profiles(), 8, 8, rng, second_pass=False)
    assert [(g.bucket, g.sp, g.sizes) for g in deal.iterations[0]] == [("X", 4, [1]), ("Z", 4, [5])]


def test_dcp_inter_ejects_a_bucket_too_short_for_its_accumulation() -> None:
    # Fast F (t = 1) beside slow S (t = 10): counts [10, 1], T_max = 10, so F needs 9 more batches;
    # it has 5 left: ejected with all its samples. S needs none and trains.
    buckets = [Bucket("F", list(range(6))), Bucket("S", [6, 7])]
    prof = profiles(F=(1, 1, 1.0), S=(1, 1, 10.0))
    rng = ScriptedRng(ints=[0, 1, 0])  # F, then S, then (after the ejection) S again
    deal = dcp_inter_epoch(buckets, prof, 2, rng, max_steps=5, min_steps=1)
    assert deal.dropped["ejected"] == 6
    assert [[(g.bucket, g.sizes) for g in it] for it in deal.iterations] == [
        [("S", [1]), ("S", [1])]
    ]
    kept = dcp_inter_epoch(
        buckets, prof, 2, ScriptedRng(ints=[0, 1]), max_steps=5, min_steps=1, eject=False
    )
    assert kept.dropped["ejected"] == 0
    assert [(g.bucket, g.sizes) for g in kept.iterations[0]] == [("F", [1] * 6), ("S", [1])]


def test_dcp_inter_drops_bucket_remainders_and_accumulates_within_a_bucket() -> None:
    buckets = [Bucket("A", list(range(7))), Bucket("B", list(range(7, 10)))]
    prof = profiles(A=(1, 2, 1.0), B=(1, 1, 2.0))
    deal = dcp_inter_epoch(
        buckets, prof, 2, ScriptedRng(ints=[0, 1]), max_steps=1, min_steps=1, eject=False
    )
    assert deal.dropped["bucket_remainder"] == 1  # A: 7 samples at batch size 2
    first = deal.iterations[0]
    assert [(g.bucket, g.sizes) for g in first] == [
        ("A", [2, 2]),
        ("B", [1]),
    ]  # counts [2, 1] for [1.0, 2.0]


# -------------------------------------------------------------------------------------------------
# Every sample once, per method, on the simulator's epoch loop


def _spec(method: str, **extra: str):
    ov = [
        "workload=videosys_zipf",
        "cluster=h200x8",
        f"method={method}",
        "method.mode=paper",
        "run.root=unused",
        *(f"{k}={v}" for k, v in extra.items()),
    ]
    if method == "bucket_static":
        ov.append("method.sp=4")
    return parse_run_spec(to_container(load_config(ov)))


@pytest.mark.parametrize("method", ["bucket_static", "dcp_intra", "dcp_inter", "dcp_inter_pac"])
def test_epoch_trains_each_sample_at_most_once_and_counts_the_rest(method: str) -> None:
    from dcp_bench.run.assemble import assemble

    spec = _spec(method)
    assert spec.unit == "epoch" and spec.label == f"{method} (paper mode)"
    parts = assemble(spec)
    dataset = parts.workload.epoch_dataset(8, spec.model.max_seq_len)
    assert dataset.n == 102_000
    ep = parts.planner.plan_epoch(dataset, parts.plan_cost, 0)
    seen = np.concatenate([it.positions for it in ep.iterations])
    assert len(seen) == len(set(seen.tolist())) == ep.info["trained_samples"]
    assert ep.info["trained_samples"] + sum(ep.info["dropped_samples"].values()) == dataset.n
    for it in ep.iterations:  # each plan covers exactly its sub-batch, on aligned groups
        assert sorted(it.plan.sample_positions()) == list(range(len(it.positions)))
    summary = run_simulated(spec, write=False)
    assert summary.status == "ok", summary.error
    assert summary.n_steps == len(ep.iterations) and summary.epochs.iterations == len(ep.iterations)
    assert summary.epochs is not None and summary.epochs.epochs == 1
    # Throughput is the epoch's tokens over the epoch's time.
    trained_tokens = int(dataset.tokens[seen].sum())
    assert summary.tokens_per_s == pytest.approx(trained_tokens / summary.epochs.epoch_time_s)
    lat = parts.workload.latent_tokens(dataset.sample_ids)[seen].sum()
    assert summary.epochs.latent_tokens_per_s == pytest.approx(lat / summary.epochs.epoch_time_s)


def test_every_deal_is_its_own_iteration_unless_packed() -> None:
    from dcp_bench.run.assemble import assemble

    one = assemble(_spec("bucket_static"))
    ds = one.workload.epoch_dataset(8)
    ep = one.planner.plan_epoch(ds, one.plan_cost, 0)
    packed = assemble(_spec("bucket_static", **{"method.deals_per_iteration": "0"}))
    ep0 = packed.planner.plan_epoch(ds, packed.plan_cost, 0)
    assert len(ep0.iterations) == 1 and len(ep.iterations) == ep.info["iterations"] > 1
    assert sorted(np.concatenate([it.positions for it in ep.iterations]).tolist()) == sorted(
        ep0.iterations[0].positions.tolist()
    )


def test_run_unit_rules_and_labels() -> None:
    assert (
        _spec("dcp_inter_pac", **{"run.unit": "step"}).label
        == "dcp_inter_pac (paper mode, per step)"
    )
    assert unit_of_label(run_label("x", "paper", "epoch")) == "epoch"
    assert unit_of_label(run_label("x", "paper", "step")) == "step" == unit_of_label("x")
    assert unit_of_label("x(sp=4) (paper mode)") == "epoch"  # reports add parameters to labels
    assert unit_of_label("x (paper mode, per step)(sp=4)") == "step"
    with pytest.raises(ConfigError, match="paper mode"):
        parse_run_spec(to_container(load_config(["method=dcp_inter", "run.unit=epoch"])))
    with pytest.raises(ConfigError, match="no fixed dataset"):
        parse_run_spec(
            to_container(
                load_config(
                    [
                        "method=dcp_inter",
                        "method.mode=paper",
                        "run.unit=epoch",
                        "workload=videosys_long",
                    ]
                )
            )
        )
    # Without an epoch sampler or a dataset, paper mode keeps its per-step form.
    assert (
        parse_run_spec(
            to_container(
                load_config(
                    ["method=dcp_inter", "method.mode=paper", "workload=prolong", "model=llama3_8b"]
                )
            )
        ).unit
        == "step"
    )


def test_iteration_plan_lays_groups_out_by_descending_degree() -> None:
    from dcp_bench.reference.samplers import GroupWork

    groups = [
        GroupWork("a", 1, [1], 28, [[5]]),
        GroupWork("b", 4, [2, 1], 0, [[0, 1], [2]]),
        GroupWork("c", 2, [1], 28, [[9]]),
    ]
    it = iteration_plan(groups, 8, "m", 3)
    g = it.plan.rounds[0].groups
    assert [(x.start, x.size) for x in g] == [(0, 4), (4, 2), (6, 1)]
    assert it.positions.tolist() == [0, 1, 2, 9, 5] and it.plan.step == 3


def test_dataset_buckets_in_order_of_first_appearance() -> None:
    from dcp_bench.batch import GlobalBatch

    b = GlobalBatch(0, np.arange(5), np.array([30, 10, 30, 20, 10]), np.array([1, 1, 1, 2, 1]))
    assert [(x.key, x.positions) for x in dataset_buckets(b)] == [
        ((1, 30), [0, 2]),
        ((1, 10), [1, 4]),
        ((2, 10), [3]),
    ]


def test_an_epoch_that_deals_nothing_says_why() -> None:
    spec = parse_run_spec(
        to_container(
            load_config(
                [
                    "workload=videosys_zipf",
                    "workload.data_size=2",
                    "workload.length_scale=64",
                    "model=tiny_stdit",
                    "method=dcp_inter_pac",
                    "method.mode=paper",
                    "nproc=4",
                    "cluster=cpu",
                ]
            )
        )
    )
    summary = run_simulated(spec, write=False)
    assert summary.status == "error"
    assert (
        "dealt no iteration from the dataset's 102 samples (dropped: bucket_remainder 102)"
        in str(summary.error)
    )
