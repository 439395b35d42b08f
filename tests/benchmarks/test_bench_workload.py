"""Workload sampling speed (pytest-benchmark; `make bench`). The goal, read from the benchmark
table and never asserted: a global batch costs well under 10 ms, so sampling stays negligible next
to planning (which is on the clock) even for 64 GPUs of short Wikipedia documents."""

from __future__ import annotations

from typing import Any

import pytest

from dcp_bench.workloads import load_workload


@pytest.mark.parametrize(
    ("name", "world"), [("wikipedia", 64), ("videosys_zipf", 32), ("sharegpt", 32)]
)
def test_bench_global_batch(benchmark: Any, name: str, world: int) -> None:
    workload = load_workload(name)
    steps = iter(range(10**9))
    batch = benchmark(lambda: workload.global_batch(next(steps), world))
    assert batch.total_tokens <= workload.token_budget(world)


def test_bench_histogram_stats(benchmark: Any) -> None:
    workload = load_workload("wikipedia")
    stats = benchmark.pedantic(workload.stats, rounds=3, iterations=1)
    assert stats["p10"] <= stats["p50"] <= stats["p99"] <= stats["max"]
