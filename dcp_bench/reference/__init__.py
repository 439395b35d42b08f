"""The reference runtime's rules (VideoSys, the DCP paper's public code), as pure functions.

Paper mode (``method.mode=paper``, ``run.unit=epoch``) reproduces the reference benchmark's loop: a
fixed dataset, a profile of every bucket, and an epoch dealt into iterations by the method's
sampler, each iteration one `StepPlan` (its own barrier, gradient sync and optimizer step).

* `dcp_bench.reference.trial_search`: the profiler's searches (the baseline's power-of-two batch
  sizes with its throughput guard and median damping; DCP's SP-degree search with its restart
  rules, candidate sets and Pyramid Activation Checkpointing), priced on a cost model.
* `dcp_bench.reference.samplers`: the samplers that deal an epoch (the baseline's bucket
  sampler; DCP-intra's fill, two passes and fit; DCP-inter's fill, ejection and gradient
  accumulation counts), and the SP-degree draws.
* `dcp_bench.reference.epoch`: an epoch's iterations as `StepPlan`s over sub-batches of the
  dataset, and `EpochPlan`, what a planner's ``plan_epoch`` returns.

Every rule cites the reference file and line in docs/reference_semantics.md; where the code reads
two ways, the chosen reading is a parameter and the other one is available for the report's
"what it takes" table. Nothing here imports torch or the runtime.
"""

from __future__ import annotations

# The label suffix of a paper-mode run with run.unit=step (one iteration of a fresh batch per
# optimizer step): it keeps such cells apart from epoch-unit cells in reports.
PER_STEP_LABEL = "paper mode, per step"


def run_label(name: str, mode: str, unit: str) -> str:
    """A run's method label: ``name``, ``name (paper mode)`` for the reference's epoch loop, or
    ``name (paper mode, per step)`` for paper mode on per-step batches."""
    if mode != "paper":
        return name
    return f"{name} ({PER_STEP_LABEL})" if unit == "step" else f"{name} (paper mode)"


def unit_of_label(label: str) -> str:
    """The run unit a label implies: ``step`` for fair mode and per-step paper mode, ``epoch``
    for paper mode on the reference's epoch loop (reports may add parameters to a label, so the
    mode's words are looked for anywhere in it)."""
    if PER_STEP_LABEL in label:
        return "step"
    return "epoch" if "(paper mode)" in label else "step"


__all__ = ["PER_STEP_LABEL", "run_label", "unit_of_label"]
