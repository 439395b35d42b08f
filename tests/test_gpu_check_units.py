"""Pieces of the GPU check that run in-process on CPU: a training state is freed when dropped
(its gradient hooks do not keep it alive), the element-wise attention check passes the runtime's
kernels and fails broken ones, the smoke test fails on a broken kernel, and the provenance."""

from __future__ import annotations

import gc
import weakref

import numpy as np
import pytest
import torch

from dcp_bench.cost.specs import model_spec
from dcp_bench.runtime.attention import SINGLE
from dcp_bench.runtime.training import FlatState, build_training_state


def _train_once(state: FlatState) -> None:
    model = state.model
    inputs = model.make_inputs(np.array([0, 1]), np.array([48, 16]), np.array([1, 1]), SINGLE, 0)
    (model.loss_sum(inputs, SINGLE, 0) / 64).backward()


def test_a_dropped_training_state_is_freed_with_its_buffers() -> None:
    refs = []
    for seed in (0, 1):
        state = build_training_state(
            model_spec("tiny_llama"), seed, torch.device("cpu"), lr=1e-3, zero_stage=0
        )
        assert isinstance(state, FlatState)
        state.begin_step()
        _train_once(state)
        # the hook moved every gradient into the fp32 accumulator and freed the parameter's own
        assert float(state.main_grad.abs().sum()) > 0
        assert all(p.grad is None for p in state.params)
        refs.append((weakref.ref(state), weakref.ref(state.main_grad), weakref.ref(state.model)))
        del state
    gc.collect()
    alive = [i for i, r in enumerate(refs) if any(x() is not None for x in r)]
    assert alive == [], f"training states {alive} still alive after gc.collect()"


def _kernels() -> dict[str, object]:
    from dcp_bench.runtime.attention import AttentionKernel

    good = AttentionKernel("sdpa")

    def not_causal(q, k, v, lens, valid, causal):  # type: ignore[no-untyped-def]
        return good(q, k, v, lens, valid, False)

    def one_segment(q, k, v, lens, valid, causal):  # type: ignore[no-untyped-def]
        return good(q, k, v, [sum(lens)], [sum(valid)], causal)

    def first_kv_group(q, k, v, lens, valid, causal):  # type: ignore[no-untyped-def]
        return good(q, k[:, :1].expand_as(k), v[:, :1].expand_as(v), lens, valid, causal)

    def zeros(q, k, v, lens, valid, causal):  # type: ignore[no-untyped-def]
        return good(q, k, v, lens, valid, causal) * 0.0

    return {
        "not_causal": not_causal,
        "one_segment": one_segment,
        "first_kv_group": first_kv_group,
        "zeros": zeros,
    }


def test_the_attention_check_passes_the_runtime_kernel_and_fails_broken_ones() -> None:
    from dcp_bench.profiling.attention_check import check_kernel
    from dcp_bench.runtime.attention import AttentionKernel

    cpu = torch.device("cpu")
    ok = check_kernel(AttentionKernel("sdpa"), 256, (8, 4, 32), cpu, torch.float32)
    assert ok["passed"] and all(t["max_rel_err"] < 1e-5 for t in ok["tensors"].values())
    for name, kern in _kernels().items():
        res = check_kernel(kern, 256, (8, 4, 32), cpu, torch.float32)
        assert not res["passed"], name
        assert max(t["max_rel_err"] for t in res["tensors"].values()) > 0.1, name


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_the_attention_check_passes_the_runtime_kernel_on_a_gpu_in_bf16() -> None:
    """On a CUDA device, in the dtype training uses: the runtime's kernel passes the element-wise
    check against the fp32 reference at a Llama-like head shape, and a broken one fails."""
    from dcp_bench.profiling.attention_check import check_kernel
    from dcp_bench.runtime.attention import AttentionKernel

    cuda = torch.device("cuda")
    ok = check_kernel(AttentionKernel("sdpa"), 4096, (32, 8, 128), cuda, torch.bfloat16)
    assert ok["passed"], ok["tensors"]
    broken = check_kernel(_kernels()["one_segment"], 4096, (32, 8, 128), cuda, torch.bfloat16)
    assert not broken["passed"]


def test_the_reference_equals_autograd_through_explicit_attention() -> None:
    """The blockwise formulas against autograd over a dense masked softmax (small, fp64)."""
    from dcp_bench.profiling.attention_check import reference_attention

    g = torch.Generator().manual_seed(3)
    lens = [5, 9, 18]
    T, H, KV, D = sum(lens), 4, 2, 8
    q, k, v, dout = (torch.randn(T, h, D, generator=g, dtype=torch.float64) for h in (H, KV, KV, H))
    ref = reference_attention(q, k, v, dout, lens, torch.float64, block=4)
    qa, ka, va = (t.clone().requires_grad_() for t in (q, k, v))
    seg = torch.repeat_interleave(torch.arange(len(lens)), torch.tensor(lens))
    pos = torch.arange(T)
    allowed = (seg[:, None] == seg[None, :]) & (pos[None, :] <= pos[:, None])
    kf, vf = ka.repeat_interleave(H // KV, 1), va.repeat_interleave(H // KV, 1)
    s = torch.einsum("qhd,khd->hqk", qa, kf) / D**0.5
    out = torch.einsum(
        "hqk,khd->qhd", torch.softmax(s.masked_fill(~allowed, float("-inf")), -1), vf
    )
    out.backward(dout)
    for name, want in (("out", out.detach()), ("dq", qa.grad), ("dk", ka.grad), ("dv", va.grad)):
        assert torch.allclose(ref[name], want, rtol=1e-10, atol=1e-12), name


def test_buckets_are_visited_ends_first() -> None:
    from tools.gpu_measure import ends_first, reference_buckets

    for n in (1, 2, 3, 7, 25):
        order = ends_first(n)
        assert sorted(order) == list(range(n))
        assert order[: min(n, 2)] == [0, n - 1][: min(n, 2)]
    buckets = reference_buckets(tiny=False)
    assert (
        len(buckets) == 25
        and buckets[0]["bucket"] == "144p image"
        and buckets[-1]["bucket"] == "720px408f"
    )
    assert buckets[-1]["tokens"] == 432000


def test_phase_deadlines_keep_later_phases_their_share() -> None:
    import time

    from tools.gpu_check import PhaseClock

    clock = PhaseClock(100.0, ["kernel", "smoke", "calibration"])
    clock.start -= 90.0  # the first phases ran long: 90 s of 100 are gone
    d = clock.deadline("smoke")
    # smoke may not eat calibration's kept half
    assert d <= clock.end - clock.budget["calibration"] / 2 + 1e-6
    assert (
        clock.deadline("calibration") >= time.time() + clock.budget["calibration"] / 2 - 1.0
        or clock.deadline("calibration") == clock.end
    )


def test_a_commit_passed_in_is_recorded_without_git(tmp_path, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    from dcp_bench.envinfo import COMMIT_ENV, git_state

    monkeypatch.delenv(COMMIT_ENV, raising=False)
    assert git_state(tmp_path) == {"git_sha": None, "git_dirty": None}
    monkeypatch.setenv(COMMIT_ENV, "abc123")
    got = git_state(tmp_path)
    assert (
        got["git_sha"] == "abc123"
        and got["git_dirty"] is None
        and COMMIT_ENV in got["git_sha_source"]
    )
