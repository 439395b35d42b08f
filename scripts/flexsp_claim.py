"""FlexSP's GPT-7B cells (ASPLOS'25, Figure 4) simulated against the published speedups.

Simulates, on FlexSP's testbed (``a100x64``: 64 A100 40GB), FlexSP (``flexsp_milp_solver``: the
project's ``flexsp_milp`` with the rules of FlexSP's solver driver) against DeepSpeed-Ulysses as
FlexSP configured it (``deepspeed_ulysses``, the fixed SP degree hand-tuned: the fastest degree
that runs every iteration) and against Megatron-LM as FlexSP configured it (``megatron_lm_tuned``:
the fixed TP/PP/CP/DP launch and recompute hand-tuned the same way, best-fit packing into
micro-batches of the max length) on FlexSP's own iterations of each corpus (GBS 512, iterations
3 .. 42, sequences over the max length dropped: `dcp_bench.workloads.flexsp_corpus`), under two
cost sources: FlexSP's own fitted model (``flexsp_fitted``) and the project's analytical model.
The Megatron cells are simulated under the analytical model only: FlexSP's fitted model prices no
tensor or pipeline parallelism (its refusal is recorded). Writes ``report.md`` and ``cells.json``
into ``--out`` (reports/flexsp_script).

The same claims run through the project's one path, run records and claims engine with
`dcp-bench reproduce claim=flexsp` (reports/flexsp; docs/reproduce.md says how the two differ);
this script stays as the standalone computation it was.

Every number it writes is simulated; the published numbers (``--published``, the GPT-7B panels
of Figure 4) are only compared against, never used to set anything.

    PYTHONPATH=. python scripts/flexsp_claim.py --lengths-dir /work/shared/data \
        --published /work/shared/data/flexsp_fig4_gpt7b.json --out reports/flexsp_script
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
import yaml

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from baselines.deepspeed_ulysses import DeepSpeedUlysses  # noqa: E402
from baselines.megatron_lm import MegatronLMTuned, megatron_plan  # noqa: E402
from dcp_bench.cost import make_cost_model  # noqa: E402
from dcp_bench.errors import ConfigError, InfeasibleError  # noqa: E402
from dcp_bench.layout import ModelParallel  # noqa: E402
from dcp_bench.planners.base import make_planner  # noqa: E402
from dcp_bench.sim import simulate_step  # noqa: E402
from dcp_bench.workloads.flexsp_corpus import CORPORA, read_flexsp_corpus  # noqa: E402

LIMITS_K = (192, 384)
GBS, START_ITER, ITERS = 512, 3, 40  # solver_all.sh; solver.py:1049 (start_iter default)
CLUSTER = "a100x64"
MEMORY_LIMIT_GB = 30  # solver_all.sh MEMORY=30
RECOMPUTE = ("none", "selective", "full")
MODEL = "gpt_7b"  # FlexSP's GPT-7B (dcp_bench/conf/model/gpt_7b.yaml)
FILES = {"wikipedia": "wikipedia_flexsp_lengths.txt"}
NOT_REACHABLE = (
    "its length list (galvatron/datasets/{name}.txt of Hetu-Galvatron b4666892) is not "
    "reachable from here (the mirror holds the path but not the file's contents); no "
    "distribution is invented for it"
)
BASELINE_SYSTEMS = ("deepspeed", "megatron")


def megatron_refusal(cost: Any) -> str | None:
    """Why ``cost`` cannot price Megatron-LM's layouts (its own one-line refusal), or None."""
    try:
        cost.with_model_parallel(ModelParallel(tp=2, pp=2))
    except ConfigError as exc:
        return f"not judged under this cost source: {exc}"
    return None


def flexsp_planner(step_time_limit_s: float, recompute: str) -> Any:
    node = yaml.safe_load((ROOT / "dcp_bench/conf/method/flexsp_milp_solver.yaml").read_text())
    node["step_time_limit_s"] = step_time_limit_s
    node["recompute"] = recompute
    return make_planner(node)


def cost_for(source: str, limit_k: int) -> Any:
    if source == "flexsp_fitted":
        return make_cost_model(
            MODEL,
            CLUSTER,
            source="flexsp_fitted",
            seq_limit_k=limit_k,
            memory_limit_gb=MEMORY_LIMIT_GB,
        )
    usable = make_cost_model(MODEL, CLUSTER).cluster.gpu.usable_mem_bytes
    # FlexSP's memory limit as the cap; ZeRO-3 as FlexSP's cost model and baselines use it
    return make_cost_model(
        MODEL,
        CLUSTER,
        source="analytical",
        mem_cap_fraction=MEMORY_LIMIT_GB * 2**30 / usable,
        zero_stage=3,
    )


def run_method(planner: Any, batches: list[Any], cost: Any) -> dict[str, Any]:
    times, infos = [], []
    for b in batches:
        plan = planner.plan(b, cost)
        r = simulate_step(plan, b, cost, round_barrier=True)
        if r.oom:
            raise InfeasibleError(f"iteration {b.step}: a micro-batch is over the GPU's memory")
        times.append(r.step_time_s)
        infos.append(
            {
                "rounds": len(plan.rounds),
                "status": plan.info.get("status"),
                "step_lb_gap": plan.info.get("step_lb_gap"),
                "safety_cap_hit": bool(plan.info.get("safety_cap_hit")),
            }
        )
    return {"iteration_s": times, "mean_s": float(np.mean(times)), "plans": infos}


def bootstrap_ratio(a: list[float], b: list[float], reps: int = 2000) -> list[float]:
    """95% CI of sum(a)/sum(b) over iterations resampled in pairs (seed 0)."""
    x, y = np.asarray(a), np.asarray(b)
    rng = np.random.default_rng(0)
    idx = rng.integers(0, len(x), size=(reps, len(x)))
    r = x[idx].sum(axis=1) / y[idx].sum(axis=1)
    return [float(np.quantile(r, 0.025)), float(np.quantile(r, 0.975))]


def verdict(ci: list[float], value: float, tol: float) -> str:
    lo, hi = value / (1 + tol), value * (1 + tol)
    if lo <= ci[0] and ci[1] <= hi:
        return "reproduced"
    if ci[1] < lo or ci[0] > hi:
        return "not reproduced"
    return "undecided"


def run_megatron(batches: list[Any], cost: Any, limit_k: int) -> dict[str, Any]:
    """Megatron-LM as FlexSP ran it (``megatron_lm_tuned``): the fastest launch (TP, PP, CP, DP,
    recompute) that runs every iteration, micro-batches of the max length, each iteration
    simulated under that launch. The search is the paper's hand-tuning (offline)."""
    seq = limit_k * 1000  # FlexSP's max length (solver.py:1000: seq_limit_k x 1000)
    tuner = MegatronLMTuned(seq_length=seq, tune_batches=len(batches))
    launch = tuner.tune(batches, cost)
    W = cost.cluster.world_size
    times = []
    for b in batches:
        plan = megatron_plan(b, cost, launch, seq, "megatron_lm_tuned")
        r = simulate_step(plan, b, cost, round_barrier=True)
        if r.oom:
            raise InfeasibleError(f"iteration {b.step}: a micro-batch is over the GPU's memory")
        times.append(r.step_time_s)
    ranked = sorted(
        (row for row in tuner._search if "step_s_sum" in row), key=lambda r: r["step_s_sum"]
    )
    return {
        "launch": launch.describe(W),
        "seq_length": seq,
        "iteration_s": times,
        "mean_s": float(np.mean(times)),
        "candidates": len(tuner._search),
        "candidates_feasible": len(ranked),
        "fastest_launches_mean_s": {
            row["launch"]: row["step_s_sum"] / len(batches) for row in ranked[:5]
        },
    }


def simulate_cell(
    source: str, corpus: Any, limit_k: int, step_limit: float, iters: int
) -> dict[str, Any]:
    cost = cost_for(source, limit_k)
    batches = corpus.batches(GBS, START_ITER, iters)
    t0 = time.time()
    # FlexSP's fitted model prices one recomputation setting (the one it was measured with);
    # under the analytical model both methods get each setting and keep their fastest.
    settings = ["none"] if source == "flexsp_fitted" else list(RECOMPUTE)
    fx_all = {}
    for rc in settings:
        try:
            fx_all[rc] = run_method(flexsp_planner(step_limit, rc), batches, cost)
        except InfeasibleError as exc:
            fx_all[rc] = {"infeasible": str(exc)}
    fx_ok = {rc: v for rc, v in fx_all.items() if "mean_s" in v}
    if not fx_ok:
        raise InfeasibleError(f"{source} {limit_k}K: FlexSP runs no iteration set: {fx_all}")
    fx_rc = min(fx_ok, key=lambda rc: fx_ok[rc]["mean_s"])
    fx = {"recompute": fx_rc, **fx_ok[fx_rc]}
    ds_all: dict[str, Any] = {}
    for sp in cost.sp_degrees():
        for rc in settings:
            try:
                ds_all[f"{sp}/{rc}"] = run_method(
                    DeepSpeedUlysses(sp=sp, recompute=rc), batches, cost
                )
            except InfeasibleError as exc:
                ds_all[f"{sp}/{rc}"] = {"infeasible": str(exc)}
    feasible = {k: v for k, v in ds_all.items() if "mean_s" in v}
    if not feasible:
        raise InfeasibleError(f"{source} {limit_k}K: no fixed SP degree runs every iteration")
    sp_best = min(feasible, key=lambda k: feasible[k]["mean_s"])
    ds = feasible[sp_best]
    speedup = sum(ds["iteration_s"]) / sum(fx["iteration_s"])
    refused = megatron_refusal(cost)
    megatron: dict[str, Any] = {"not_judged": refused} if refused else {}
    if not refused:
        mg = run_megatron(batches, cost, limit_k)
        megatron = {
            **mg,
            "speedup": sum(mg["iteration_s"]) / sum(fx["iteration_s"]),
            "ci95": bootstrap_ratio(mg["iteration_s"], fx["iteration_s"]),
        }
    return {
        "megatron": megatron,
        "cost": cost.describe(),
        "flexsp": fx,
        "deepspeed": {"sp": sp_best, **ds},
        "deepspeed_by_sp": {
            k: (v["mean_s"] if "mean_s" in v else v["infeasible"]) for k, v in ds_all.items()
        },
        "flexsp_by_recompute": {
            k: (v["mean_s"] if "mean_s" in v else v["infeasible"]) for k, v in fx_all.items()
        },
        "speedup_vs_deepspeed": speedup,
        "ci95": bootstrap_ratio(ds["iteration_s"], fx["iteration_s"]),
        "wall_s": time.time() - t0,
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--lengths-dir", required=True, help="folder holding FlexSP's length lists")
    ap.add_argument("--published", required=True, help="flexsp_fig4_gpt7b.json")
    ap.add_argument("--claim", default=str(ROOT / "results/claims/flexsp_deepspeed.yaml"))
    ap.add_argument("--out", default=str(ROOT / "reports/flexsp_script"))
    ap.add_argument("--sources", default="flexsp_fitted,analytical")
    ap.add_argument(
        "--step-time-limit-s",
        type=float,
        default=300.0,
        help="wall-clock safety cap of FlexSP's planning a step (HiGHS is bounded by the method "
        "config's mip_max_nodes); a plan it cuts short is counted and reported as load-dependent",
    )
    ap.add_argument("--iters", type=int, default=ITERS, help="FlexSP's: 40")
    ap.add_argument("--render-only", action="store_true", help="rewrite report.md from cells.json")
    ap.add_argument(
        "--megatron-only",
        metavar="CELLS_JSON",
        help="simulate only the Megatron-LM cells (analytical) against the FlexSP iteration times "
        "of an earlier cells.json (named in the output with its commit); prints them as JSON and "
        "writes nothing",
    )
    args = ap.parse_args()
    if args.render_only:
        doc = json.loads((Path(args.out) / "cells.json").read_text())
        (Path(args.out) / "report.md").write_text(render(doc, args.sources.split(",")))
        return
    pub = json.loads(Path(args.published).read_text())
    claim = yaml.safe_load(Path(args.claim).read_text())
    tol = float(claim["tolerance"])
    if args.megatron_only:
        print(json.dumps(megatron_only(args, pub, tol), indent=1))
        return
    sources = args.sources.split(",")
    cells: list[dict[str, Any]] = []
    sims: dict[str, Any] = {}
    for limit_k in LIMITS_K:
        for name in CORPORA:
            published = pub["speedup"][f"max_seq_{limit_k}K"][name]
            base = {"corpus": name, "max_seq_k": limit_k}
            mg = {**base, "baseline": "megatron", "published": published["flexsp_vs_megatron"]}
            ds = {**base, "baseline": "deepspeed", "published": published["flexsp_vs_deepspeed"]}
            if name not in FILES:
                why = NOT_REACHABLE.format(name=name)
                cells += [
                    {**ds, "judged": False, "reason": why},
                    {**mg, "judged": False, "reason": why},
                ]
                continue
            corpus = read_flexsp_corpus(name, Path(args.lengths_dir) / FILES[name], limit_k, 64)
            ds["corpus_provenance"] = corpus.provenance()
            ds["judged"] = True
            ds["simulated"] = {}
            mg.update(corpus_provenance=corpus.provenance(), simulated={}, not_judged_under={})
            for source in sources:
                print(f"{name} {limit_k}K {source} ...", flush=True)
                sim = simulate_cell(source, corpus, limit_k, args.step_time_limit_s, args.iters)
                sims[f"{name}_{limit_k}K_{source}"] = sim
                ds["simulated"][source] = {
                    "speedup": sim["speedup_vs_deepspeed"],
                    "ci95": sim["ci95"],
                    "flexsp_iteration_s": sim["flexsp"]["mean_s"],
                    "deepspeed_iteration_s": sim["deepspeed"]["mean_s"],
                    "deepspeed_sp": sim["deepspeed"]["sp"],
                    "flexsp_recompute": sim["flexsp"]["recompute"],
                    "ci_verdict": verdict(sim["ci95"], ds["published"], tol),
                }
                m = sim["megatron"]
                if "not_judged" in m:
                    mg["not_judged_under"][source] = m["not_judged"]
                    continue
                mg["simulated"][source] = {
                    "speedup": m["speedup"],
                    "ci95": m["ci95"],
                    "flexsp_iteration_s": sim["flexsp"]["mean_s"],
                    "megatron_iteration_s": m["mean_s"],
                    "megatron_launch": m["launch"],
                    "flexsp_recompute": sim["flexsp"]["recompute"],
                    "ci_verdict": verdict(m["ci95"], mg["published"], tol),
                }
            mg["judged"] = bool(mg["simulated"])
            if not mg["judged"]:
                mg["reason"] = "; ".join(mg["not_judged_under"].values())
            cells += [ds, mg]
    # Validation: the published iteration times (192K panel, read off the bars, +-1 s)
    val = []
    times = pub["iteration_time_s_approx"]["max_seq_192K"]
    for source in sources:
        for name in FILES:
            key = f"{name}_192K_{source}"
            if key not in sims:
                continue
            systems = [
                ("flexsp", sims[key]["flexsp"]["mean_s"]),
                ("deepspeed", sims[key]["deepspeed"]["mean_s"]),
            ]
            if "mean_s" in sims[key]["megatron"]:
                systems.append(("megatron", sims[key]["megatron"]["mean_s"]))
            for system, sim_s in systems:
                p = times[name][system]
                err = sim_s / p - 1
                # the reading's +-1 s widens the band; beyond it the simulator misses
                ok = abs(sim_s - p) <= tol * p + 1.0
                val.append(
                    {
                        "source": source,
                        "corpus": name,
                        "system": system,
                        "published_s": p,
                        "simulated_s": sim_s,
                        "error": err,
                        "within_tolerance": ok,
                    }
                )
    for c in cells:
        for source, s in c.get("simulated", {}).items():
            # the systems the cell compares: FlexSP and its baseline, each against its own
            # published time
            rows = [
                v for v in val if v["source"] == source and v["system"] in ("flexsp", c["baseline"])
            ]
            valid = bool(rows) and all(v["within_tolerance"] for v in rows)
            s["validated"] = valid
            s["verdict"] = s["ci_verdict"] if valid else "undecided (simulator not validated)"
    commit = subprocess.run(
        ["git", "-C", str(ROOT), "rev-parse", "--short", "HEAD"], capture_output=True, text=True
    ).stdout.strip()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    doc = {
        "what": "FlexSP Figure 4 GPT-7B cells: simulated vs published speedups (SIMULATED)",
        "claim": claim["id"],
        "tolerance": tol,
        "published_source": pub["source"],
        "setup": {
            "cluster": CLUSTER,
            "gbs": GBS,
            "iterations": [START_ITER, START_ITER + args.iters - 1],
            "memory_limit_gb": MEMORY_LIMIT_GB,
            "model": "gpt_7b (Galvatron's GPT-7B config: 32 layers, hidden 4096, 64 heads)",
            "flexsp": "dcp_bench/conf/method/flexsp_milp_solver.yaml",
            "flexsp_step_time_limit_s": args.step_time_limit_s,
            "deepspeed": "deepspeed_ulysses, fixed SP (and, analytical, recompute) hand-tuned: "
            "the fastest setting that runs every iteration",
            "megatron": "megatron_lm_tuned (analytical only), the fixed TP/PP/CP/DP launch and "
            "recompute hand-tuned: the fastest that runs every iteration; micro-batches of the "
            "max length, DP-ZeRO1 (dcp_bench/cost/megatron.py prices TP/PP)",
            "recompute": "flexsp_fitted: not priced (FlexSP's fit; its activation constant "
            "is close to the analytical count without recomputation); analytical: none, "
            "selective or full, each method its fastest",
        },
        "commit": commit,
        "cells": cells,
        "validation": val,
        "simulations": sims,
    }
    (out / "cells.json").write_text(json.dumps(doc, indent=1, default=str) + "\n")
    (out / "report.md").write_text(render(doc, sources))
    print((out / "report.md").read_text())


def megatron_only(args: Any, pub: dict[str, Any], tol: float) -> dict[str, Any]:
    """The Wikipedia Megatron-LM cells under the analytical model against FlexSP's simulated
    iteration times from an earlier run's cells.json (``--megatron-only``), with the same
    bootstrap CI, verdict rule and validation as a full run (FlexSP's and Megatron-LM's 192K
    published times)."""
    earlier = json.loads(Path(args.megatron_only).read_text())
    out: dict[str, Any] = {
        "what": "Megatron-LM cells (SIMULATED, analytical), FlexSP times from an earlier run",
        "flexsp_times_from": {"file": args.megatron_only, "commit": earlier.get("commit")},
        "cells": [],
    }
    times = pub["iteration_time_s_approx"]["max_seq_192K"]
    for limit_k in LIMITS_K:
        for name, fname in FILES.items():
            sim = earlier["simulations"][f"{name}_{limit_k}K_analytical"]
            corpus = read_flexsp_corpus(name, Path(args.lengths_dir) / fname, limit_k, 64)
            batches = corpus.batches(GBS, START_ITER, args.iters)
            fx = sim["flexsp"]["iteration_s"]
            if len(fx) != len(batches):
                raise ValueError(
                    f"{args.megatron_only}: {len(fx)} FlexSP iterations, not {args.iters}"
                )
            mg = run_megatron(batches, cost_for("analytical", limit_k), limit_k)
            ci = bootstrap_ratio(mg["iteration_s"], fx)
            cell = {
                "corpus": name,
                "max_seq_k": limit_k,
                "published": pub["speedup"][f"max_seq_{limit_k}K"][name]["flexsp_vs_megatron"],
                "speedup": sum(mg["iteration_s"]) / sum(fx),
                "ci95": ci,
                "flexsp_iteration_s": float(np.mean(fx)),
                "megatron": {k: v for k, v in mg.items() if k != "iteration_s"},
            }
            cell["ci_verdict"] = verdict(ci, cell["published"], tol)
            if limit_k == 192:
                cell["validation"] = {
                    system: {
                        "published_s": times[name][system],
                        "simulated_s": sim_s,
                        "within_tolerance": abs(sim_s - times[name][system])
                        <= tol * times[name][system] + 1.0,
                    }
                    for system, sim_s in (
                        ("flexsp", float(np.mean(fx))),
                        ("megatron", mg["mean_s"]),
                    )
                }
            out["cells"].append(cell)
    valid = all(
        v["within_tolerance"] for c in out["cells"] for v in c.get("validation", {}).values()
    )
    for c in out["cells"]:
        c["verdict"] = c["ci_verdict"] if valid else "undecided (simulator not validated)"
    return out


def first_screen(doc: dict[str, Any], sources: list[str]) -> list[str]:
    """One line per claim: the deciding cell (Wikipedia, 192K) under each cost source."""
    out = []
    for baseline, claimed in (
        ("deepspeed", "1.72x over DeepSpeed-Ulysses"),
        ("megatron", "1.98x over Megatron-LM"),
    ):
        cell = next(
            c
            for c in doc["cells"]
            if c["corpus"] == "wikipedia" and c["max_seq_k"] == 192 and c["baseline"] == baseline
        )
        if not cell["judged"]:
            out.append(f"- **FlexSP {claimed}** (Wikipedia, 192K): not judged (below).")
            continue
        parts = [
            f"{s}: {cell['simulated'][s]['speedup']:.2f}x "
            f"[{cell['simulated'][s]['ci95'][0]:.2f}, {cell['simulated'][s]['ci95'][1]:.2f}], "
            f"{cell['simulated'][s]['verdict']}"
            if s in cell["simulated"]
            else f"{s}: not judged (it prices no TP/PP)"
            for s in sources
        ]
        out.append(
            f"- **FlexSP {claimed}** (Wikipedia, 192K), simulated: " + "; ".join(parts) + "."
        )
    return out


def render(doc: dict[str, Any], sources: list[str]) -> str:
    L = [
        "# FlexSP's claim: GPT-7B cells of Figure 4, simulated vs published",
        "",
        "**All numbers here are simulated** on the `a100x64` cluster spec under two cost "
        "sources: `flexsp_fitted` (FlexSP's own fitted cost model, Hetu-Galvatron b4666892 "
        "solver.py, constants as the authors give them) and `analytical` (this project's model; "
        "A100 datasheet constants, efficiency constants the built-in assumptions: nothing fitted "
        "on an A100). The published speedups validate; nothing was fitted to them.",
        "",
        f"Claim file: `results/claims/flexsp.yaml` (1.98x over Megatron-LM) and "
        f"`results/claims/flexsp_deepspeed.yaml` (1.72x over DeepSpeed-Ulysses); tolerance "
        f"{doc['tolerance']:.0%}. Published: {doc['published_source']}. Report commit "
        f"{doc['commit']}.",
        "",
        *first_screen(doc, sources),
        "",
        "Setup: " + "; ".join(f"{k}: {v}" for k, v in doc["setup"].items()) + ".",
        "",
        "## The 12 GPT-7B cells",
        "",
        "| max len | corpus | FlexSP over | published | "
        + " | ".join(f"simulated ({s}) [95% CI] verdict" for s in sources)
        + " |",
        "|---|---|---|---|" + "---|" * len(sources),
    ]
    for c in doc["cells"]:
        row = f"| {c['max_seq_k']}K | {c['corpus']} | {c['baseline']} | {c['published']:.2f}x |"
        for s in sources:
            if not c["judged"]:
                row += " not judged |"
            elif s not in c["simulated"]:
                row += " not judged (this source prices no TP/PP) |"
            else:
                v = c["simulated"][s]
                setting = (
                    f"DS SP/recompute {v['deepspeed_sp']}"
                    if "deepspeed_sp" in v
                    else f"Megatron {v['megatron_launch']}"
                )
                row += (
                    f" {v['speedup']:.2f}x [{v['ci95'][0]:.2f}, {v['ci95'][1]:.2f}] "
                    f"{v['verdict']} ({setting}, FlexSP recompute {v['flexsp_recompute']}) |"
                )
        L.append(row)
    L += ["", "## Cells not judged", ""]
    reasons: dict[str, list[str]] = {}
    for c in doc["cells"]:
        if not c["judged"]:
            reasons.setdefault(c["reason"], []).append(
                f"{c['max_seq_k']}K {c['corpus']} vs {c['baseline']}"
            )
        for source, why in c.get("not_judged_under", {}).items():
            if c["judged"]:
                reasons.setdefault(why, []).append(
                    f"{c['max_seq_k']}K {c['corpus']} vs {c['baseline']} ({source})"
                )
    for why, which in reasons.items():
        L.append(f"- {', '.join(which)}: {why}.")
    L += [
        "",
        "## Validation: published iteration times (192K panel, read off the bars, +-1 s)",
        "",
        "A simulated verdict stands only when the simulator reproduces FlexSP's and the cell's "
        "baseline's (DeepSpeed's or Megatron-LM's) own published iteration times within the "
        "tolerance (plus the 1 s reading error); otherwise the cell is undecided in simulation.",
        "",
        "| cost source | corpus | system | published s | simulated s | error | within |",
        "|---|---|---|---|---|---|---|",
    ]
    for v in doc["validation"]:
        L.append(
            f"| {v['source']} | {v['corpus']} | {v['system']} | {v['published_s']:.1f} | "
            f"{v['simulated_s']:.2f} | {v['error']:+.0%} | "
            f"{'yes' if v['within_tolerance'] else 'no'} |"
        )
    L += ["", "## Mean iteration s by setting (DeepSpeed: SP/recompute; FlexSP: recompute)", ""]
    for key, sim in doc["simulations"].items():
        by = ", ".join(
            f"{k}: {v:.2f}" if isinstance(v, float) else f"{k}: infeasible"
            for k, v in sim["deepspeed_by_sp"].items()
        )
        fx = ", ".join(
            f"{k}: {v:.2f}" if isinstance(v, float) else f"{k}: infeasible"
            for k, v in sim["flexsp_by_recompute"].items()
        )
        mg = sim.get("megatron", {})
        if "fastest_launches_mean_s" in mg:
            fx += "; Megatron-LM (fastest 5 of {} feasible launches of {}) ".format(
                mg["candidates_feasible"], mg["candidates"]
            ) + ", ".join(f"{k}: {v:.2f}" for k, v in mg["fastest_launches_mean_s"].items())
        L.append(f"- {key}: DeepSpeed {by}; FlexSP {fx}")
    L += ["", "## How FlexSP's rounds were solved", ""]
    for key, sim in doc["simulations"].items():
        status = [st for p in sim["flexsp"]["plans"] for st in (p["status"] or [])]
        milp = sum(1 for st in status if not str(st).startswith("fallback"))
        gaps = [
            p["step_lb_gap"] for p in sim["flexsp"]["plans"] if p.get("step_lb_gap") is not None
        ]
        gap = (
            f"; gap to the solver-independent lower bound median {np.median(gaps):.1%}, "
            f"max {max(gaps):.1%}"
            if gaps
            else ""
        )
        hit = sum(1 for p in sim["flexsp"]["plans"] if p.get("safety_cap_hit"))
        load = (
            f"; {hit} of {len(sim['flexsp']['plans'])} steps hit the wall-clock safety cap "
            "(load-dependent)"
            if hit
            else ""
        )
        L.append(
            f"- {key}: {len(status)} rounds; HiGHS's incumbent kept in {milp}, the heuristic "
            f"layout (best homogeneous or mixed, `fallback (...)`) in {len(status) - milp}{gap}"
            f"{load}"
        )
    L += [
        "",
        "## What these numbers rest on",
        "",
        "- FlexSP's planner here is `flexsp_milp` with FlexSP's solver rules, solved by HiGHS "
        "stopped after a fixed number of branch-and-bound nodes a round (`mip_max_nodes`, "
        "single thread, fixed seed: the same input gives the same plan on any host); FlexSP "
        "gives SCIP 10 s a micro-batch in parallel processes. Where HiGHS's incumbent loses to "
        "the heuristic layout the heuristic is kept (counts above), so the simulated FlexSP is "
        "no better than what its program would find with more search: its speedups are, on "
        "that count, low estimates. A wall-clock safety cap a step remains; a step it cut "
        "short is counted above as load-dependent.",
        "- The lower bound of the solved rounds leaves out the per-group bias (FlexSP's fitted "
        "629 ms a group), so its gaps overstate what any layout could still gain.",
        "- Iteration times exclude planning, as FlexSP overlaps its solver with training.",
        "- The A100 analytical constants are the datasheet's and the model's built-in "
        "assumptions (`dcp_bench/conf/gpu/a100_40gb.yaml`); the cross-node bandwidth reads the "
        "paper's 400 Gb/s as one link a node (`dcp_bench/conf/cluster/a100x64.yaml`).",
        "",
        "Reproduce: `PYTHONPATH=. python scripts/flexsp_claim.py --lengths-dir /work/shared/data "
        "--published /work/shared/data/flexsp_fig4_gpt7b.json --out reports/flexsp_script`.",
        "",
    ]
    return "\n".join(L)


if __name__ == "__main__":
    main()
