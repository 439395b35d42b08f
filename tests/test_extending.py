"""docs/extending.md, followed literally through the installed `dcp-bench` command: every file the
page shows is written into an empty folder, every command it shows runs in a subprocess there,
and what the page promises is checked against the run records and the report. Beside it, the
user-code import path and its one-line failure, through the console script as well."""

from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from dcp_bench.files import sha256_file
from dcp_bench.paths import REPO_ROOT
from dcp_bench.plan import PLAN_RULES
from dcp_bench.records import iter_summaries

DOC = REPO_ROOT / "docs" / "extending.md"
FENCE = re.compile(r"^```(\w+)(?:[ \t]+(\S+))?[ \t]*\n(.*?)^```[ \t]*$", re.S | re.M)
CLI = (
    Path(sys.executable).parent / "dcp-bench"
)  # the console script pip installed beside this python


def doc_steps(text: str) -> list[tuple[str, str, str]]:
    """(kind, path-or-'', body) of every fenced block, in page order."""
    return [(lang, path or "", body) for lang, path, body in FENCE.findall(text)]


def doc_commands(body: str) -> list[str]:
    """The command lines of a bash block (a line ending in a backslash continues)."""
    return [
        ln.strip()
        for ln in body.replace("\\\n", " ").splitlines()
        if ln.strip() and not ln.startswith("#")
    ]


def user_env(**extra: str) -> dict[str, str]:
    """The environment of a user's shell: no PYTHONPATH, no user config path set."""
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "DCP_BENCH_CONF_PATH")}
    env["OMP_NUM_THREADS"] = "1"
    return {**env, **extra}


def run_cli(
    args: list[str], cwd: Path, env: dict[str, str], timeout: float = 600
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(CLI), *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout
    )


def write_doc_files(folder: Path, names: set[str] | None = None) -> None:
    for _, path, body in doc_steps(DOC.read_text()):
        if path and (names is None or path in names):
            target = folder / path
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_text(body)


def test_doc_has_every_part() -> None:
    text = DOC.read_text()
    for heading in (
        "## Add a dataset",
        "## Add a baseline",
        "### The contract",
        "## Variants of a packaged method",
        "## Compare and report",
        "## Train it for real",
    ):
        assert heading in text, heading
    files = [p for _, p, _ in doc_steps(text) if p]
    assert {
        "my_conf/workload/my_corpus.yaml",
        "my_conf/method/by_length.yaml",
        "my_methods/by_length.py",
        "my_conf/method/megatron_full.yaml",
    } <= set(files)
    # the page states the plan rules the validator enforces, word for word
    for rule in PLAN_RULES:
        assert f"- {rule}\n" in text, rule
    # the example workload config lists every batch-policy key, so plain overrides work
    corpus = next(b for _, p, b in doc_steps(text) if p == "my_conf/workload/my_corpus.yaml")
    for key in (
        "tokens_per_gpu",
        "samples_per_step",
        "length_scale",
        "max_len",
        "max_len_policy",
        "description",
        "source",
        "licence",
    ):
        assert re.search(rf"^{key}:", corpus, re.M), key
    # the line counts the page states are the files' own
    module = next(b for _, p, b in doc_steps(text) if p == "my_methods/by_length.py")
    method_yaml = next(b for _, p, b in doc_steps(text) if p == "my_conf/method/by_length.yaml")
    assert f"a {len(corpus.splitlines())}-line YAML file" in text
    assert (
        f"a {len(module.splitlines())}-line Python module and a "
        f"{len(method_yaml.splitlines())}-line YAML file" in text
    )


def section_steps(heading: str) -> list[tuple[str, str, str]]:
    """The fenced blocks of one section of the page, from its heading to the next ``## ``."""
    text = DOC.read_text()
    start = text.index(heading + "\n")
    end = text.find("\n## ", start + len(heading))
    return doc_steps(text[start:] if end < 0 else text[start:end])


def follow_section(heading: str, folder: Path, env: dict[str, str]) -> None:
    """Write the section's files into ``folder`` and run its commands there, as the reader would."""
    for lang, path, body in section_steps(heading):
        if path:
            (folder / path).parent.mkdir(parents=True, exist_ok=True)
            (folder / path).write_text(body)
        elif lang == "bash":
            for line in doc_commands(body):
                argv = shlex.split(line)
                if argv[0] == "dcp-bench":
                    res = run_cli(argv[1:], folder, env)
                    assert res.returncode == 0, f"{line}\n{res.stdout}\n{res.stderr}"
                elif argv[0] == "python":
                    subprocess.run([sys.executable, *argv[1:]], check=True, cwd=folder, env=env)
                else:
                    raise AssertionError(f"the doc runs a command this test does not know: {line}")


def test_doc_has_the_workload_kind_and_report_section_recipes() -> None:
    text = DOC.read_text()
    for heading in ("## Add a workload kind: a class of your own", "## Add a report section"):
        assert heading in text, heading
    files = {p for _, p, _ in doc_steps(text) if p}
    assert {
        "my_workloads/bimodal.py",
        "my_conf/workload/bimodal.yaml",
        "my_report/tokens.py",
        "try_section.py",
    } <= files


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_follow_the_workload_kind_and_report_section_recipes(tmp_path: Path) -> None:
    """The two recipes, literally, in an empty folder (this checkout's package, the reader's own
    modules imported from the folder): the class workload runs under two methods that see the
    same batches and keep its provenance; the report ends with the new section, whose numbers are
    the runs' own."""
    env = user_env(PYTHONPATH=str(REPO_ROOT))
    follow_section("## Add a workload kind: a class of your own", tmp_path, env)
    runs = {s.method: s for s in iter_summaries(tmp_path / "runs", "kinds")}
    assert set(runs) == {"dcp", "bucket_static"} and all(s.status == "ok" for s in runs.values())
    assert all(
        s.context.workload.description.startswith("bimodal: 2048 or 65536 tokens")
        for s in runs.values()
    )
    assert all(
        s.context.workload.provenance["licence"] == "none (generated)" for s in runs.values()
    )
    batches = {}
    for method, s in runs.items():
        steps = [
            json.loads(ln)
            for ln in (tmp_path / "runs" / "kinds" / s.run_id / "steps.jsonl")
            .read_text()
            .splitlines()
        ]
        batches[method] = [(st["step"], st["tokens"], st["samples"]) for st in steps]
    assert batches["dcp"] == batches["bucket_static"] and len(batches["dcp"]) == 2

    follow_section("## Add a report section", tmp_path, env)
    report = (tmp_path / "reports" / "kinds" / "report.md").read_text()
    section = report[report.index("## Tokens per second") :]
    rows = re.findall(r"^\| bimodal \| (\w+) \| ([0-9.e+]+) \|$", section, re.M)
    assert {m for m, _ in rows} == {"dcp", "bucket_static"}
    for method, value in rows:
        assert float(value) == pytest.approx(runs[method].tokens_per_s, rel=5e-3)


def test_user_code_imports_in_the_console_script(tmp_path: Path) -> None:
    """The planner module beside the config folder imports through the installed command, run
    from another folder, with no PYTHONPATH; `plan --validate` says the plan keeps every rule."""
    write_doc_files(
        tmp_path,
        {"my_methods/by_length.py", "my_methods/__init__.py", "my_conf/method/by_length.yaml"},
    )
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    res = run_cli(
        [
            "plan",
            f"extra_conf={tmp_path / 'my_conf'}",
            "method=by_length",
            "workload=sharegpt",
            "model=llama3_8b",
            "cluster=h200x8",
            "--validate",
        ],
        elsewhere,
        user_env(),
    )
    assert res.returncode == 0, res.stderr
    assert (
        "by_length on step 0 of sharegpt" in res.stdout
        and f"valid plan ({len(PLAN_RULES)} rules checked" in res.stdout
    )


def test_missing_user_module_is_one_line_naming_the_path(tmp_path: Path) -> None:
    write_doc_files(tmp_path, {"my_conf/method/by_length.yaml"})  # the config without its module
    res = run_cli(
        [
            "plan",
            "extra_conf=my_conf",
            "method=by_length",
            "workload=sharegpt",
            "model=llama3_8b",
            "cluster=h200x8",
        ],
        tmp_path,
        user_env(),
    )
    assert res.returncode == 2
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1, res.stderr
    assert "no module named 'my_methods'" in lines[0]
    assert str(tmp_path.resolve()) in lines[0] and str((tmp_path / "my_conf").resolve()) in lines[0]
    assert "Traceback" not in res.stderr


def test_plan_validate_lists_every_offence(tmp_path: Path) -> None:
    """A planner that breaks four rules at once: each is printed in words, exit status 1."""
    (tmp_path / "bad_methods").mkdir()
    (tmp_path / "bad_methods" / "__init__.py").write_text("")
    (tmp_path / "bad_methods" / "broken.py").write_text(
        "from dcp_bench.plan import Group, MicroBatch, Round, StepPlan\nfrom "
        "dcp_bench.planners.base import Planner\n\n\nclass Broken(Planner):\n    def plan(self, "
        "batch, cost):\n        # a group of 3 ranks; a group at rank 2 of size 4 holding all but "
        "the first and last\n        # samples in one micro-batch (far over the memory cap); the "
        "last sample left out\n        groups = [Group(0, 3, [MicroBatch((0,))]), Group(2, 4, "
        "[MicroBatch(tuple(range(1, batch.n - 1)))])]\n        return "
        "StepPlan(world_size=cost.cluster.world_size, rounds=[Round(groups)])\n"
    )
    (tmp_path / "conf" / "method").mkdir(parents=True)
    (tmp_path / "conf" / "method" / "broken.yaml").write_text(
        "name: broken\n_target_: bad_methods.broken.Broken\n"
    )
    res = run_cli(
        [
            "plan",
            "extra_conf=conf",
            "method=broken",
            "workload=sharegpt",
            "model=llama3_8b",
            "cluster=h200x8",
            "--validate",
        ],
        tmp_path,
        user_env(),
    )
    assert res.returncode == 1, res.stderr
    offences = [ln for ln in res.stdout.splitlines() if ln.startswith("  - ")]
    assert len(offences) == 4, res.stdout
    assert "group at rank 0 (size 3): group size must be a power of two" in offences[0]
    assert "group at rank 2 (size 4): group not aligned" in offences[1]
    assert "micro-batch 0: predicted" in offences[2] and "over the memory cap" in offences[2]
    assert "fair mode: 1 sample(s) missing from the plan" in offences[3]


@pytest.mark.slow
@pytest.mark.timeout(1500)
def test_follow_extending_doc(tmp_path: Path) -> None:
    env = user_env()
    for kind, path, body in doc_steps(DOC.read_text()):
        if path:
            target = tmp_path / path
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_text(body)
            continue
        if kind != "bash":
            continue
        for line in doc_commands(body):
            argv = shlex.split(line, comments=True)
            if argv[0] == "export":
                key, _, value = argv[1].partition("=")
                env[key] = value
            elif argv[0] == "dcp-bench":
                # `# exits 3` after a command: the doc says some of its runs fail (the sweep then
                # lists them and exits 3); every other command must succeed.
                expected = 3 if "# exits 3" in line else 0
                res = run_cli(argv[1:], tmp_path, env)
                assert res.returncode == expected, f"{line}\n{res.stdout}\n{res.stderr}"
                if expected == 3:
                    assert "failed runs" in res.stdout and "InfeasibleError" in res.stdout, (
                        res.stdout
                    )
            elif argv[0] == "python":
                subprocess.run([sys.executable, *argv[1:]], check=True, cwd=tmp_path, env=env)
            else:
                raise AssertionError(f"the doc runs a command this test does not know: {line}")

    # the dataset: its own name, description and licence, and the data file's sha256 in every record
    runs = list(iter_summaries(tmp_path / "runs", "extending"))
    mine = [s for s in runs if s.workload == "my_corpus"]
    assert mine and all(s.context.workload.provenance["licence"] == "CC0-1.0" for s in mine)
    assert {s.context.workload.provenance["data_sha256"] for s in mine} == {
        sha256_file(tmp_path / "my_lengths.txt")
    }
    assert mine[0].context.workload.description.startswith("made-up lognormal")

    # the planner imported from beside its config ran on both workloads, 5 repeats each
    ok = {(s.workload, s.method) for s in runs if s.status == "ok"}
    assert {
        ("my_corpus", "by_length"),
        ("sharegpt", "by_length"),
        ("my_corpus", "megatron_full"),
    } <= ok
    assert sum(1 for s in runs if (s.workload, s.method) == ("my_corpus", "by_length")) == 5

    # the variant inherits the packaged method and changes only what it says
    full = next(s for s in runs if s.method == "megatron_full")
    cfg = (tmp_path / "runs" / "extending" / full.run_id / "config.yaml").read_text()
    assert "recompute: full" in cfg and "baselines.megatron_hybrid_cp.MegatronHybridCP" in cfg
    per_method = [s for s in runs if s.method == "megatron_hybrid_cp"]
    assert per_method and all(
        "method.recompute=selective" in s.context.overrides for s in per_method
    )

    # the report's first section is the user's comparison: by_length over each named baseline
    out = tmp_path / "reports" / "extending"
    md = (out / "report.md").read_text()
    assert re.findall(r"^## (.+)$", md, re.M)[0] == "Methods against baselines"
    assert "NO DATA" not in md and "Verdict" not in md and "not in this campaign" not in md
    first = md.split("## Methods against baselines", 1)[1].split("\n## ", 1)[0]
    table = [
        ln
        for ln in first.splitlines()
        if ln.startswith("| my_corpus") or ln.startswith("| sharegpt")
    ]
    rows = [[c.strip() for c in ln.strip("|").split("|")] for ln in table]
    assert {r[3] for r in rows} == {"by_length"}  # no baseline-vs-baseline rows
    assert {r[4] for r in rows} == {
        "dcp",
        "bucket_static",
        "megatron_full",
        "megatron_hybrid_cp(recompute=selective)",
    }
    # selective recomputation does not fit sharegpt's longest conversations: failed runs, named
    failed = [
        r for r in rows if r[4] == "megatron_hybrid_cp(recompute=selective)" and r[0] == "sharegpt"
    ]
    assert failed and failed[0][5] == "-" and failed[0][8].startswith("baseline failed")
    comp = pd.read_csv(out / "tables" / "method_vs_baseline.csv")
    mine_comp = comp[(comp["workload"] == "my_corpus") & (comp["baseline"] == "dcp")].iloc[0]
    by = {
        s.seed: s.step_time_s for s in runs if s.workload == "my_corpus" and s.method == "by_length"
    }
    ref = {s.seed: s.step_time_s for s in runs if s.workload == "my_corpus" and s.method == "dcp"}
    # the speedup is the median of per-seed paired ratios (same seed = same data for both methods)
    assert mine_comp["speedup"] == pytest.approx(
        np.median([ref[k] / by[k] for k in sorted(by)]), rel=1e-5
    )
    assert (
        "my_lengths.txt" in md
        and sha256_file(tmp_path / "my_lengths.txt") in md
        and "CC0-1.0" in md
    )
    assert str(tmp_path) not in md and str(tmp_path) not in (out / "report.html").read_text()

    # train: the new planner's per-step losses equal bucket_static's on the same batches
    trained = {s.method: s for s in iter_summaries(tmp_path / "runs", "train")}
    assert trained["by_length"].status == "ok" and trained["bucket_static"].status == "ok"
    mine_losses, ref_losses = (
        trained["by_length"].training.losses,
        trained["bucket_static"].training.losses,
    )
    assert len(mine_losses) == len(ref_losses) == 3
    assert np.allclose(mine_losses, ref_losses, rtol=5e-6, atol=0), (mine_losses, ref_losses)
    summary = json.loads((out / "summary.json").read_text())
    assert summary["method_vs_baseline"] and not summary["skipped_records"]
    shutil.rmtree(tmp_path / "runs", ignore_errors=True)


@pytest.mark.slow
@pytest.mark.dist
@pytest.mark.timeout(600)
def test_torchrun_ranks_import_user_code_from_another_folder(tmp_path: Path) -> None:
    """`train` run from a folder that holds neither the config nor the module: the ranks torchrun
    starts import the planner from beside the config folder (no PYTHONPATH set by the user)."""
    write_doc_files(
        tmp_path / "user",
        {"my_methods/by_length.py", "my_methods/__init__.py", "my_conf/method/by_length.yaml"},
    )
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    res = run_cli(
        [
            "train",
            f"extra_conf={tmp_path / 'user' / 'my_conf'}",
            "method=by_length",
            "workload=sharegpt",
            "workload.length_scale=64",
            "nproc=2",
            "steps=1",
            "warmup_steps=0",
            "root=runs",
        ],
        elsewhere,
        user_env(),
    )
    assert res.returncode == 0, res.stdout + res.stderr
    (summary,) = iter_summaries(elsewhere / "runs", "train")
    assert summary.method == "by_length" and summary.status == "ok" and summary.executor == "torch"


def test_follow_the_cost_term_recipe(tmp_path: Path) -> None:
    """The cost-term recipe, literally, in an empty folder: its script records a simulated run
    priced with the new term and prints the steps' time parts, the new one by name among them;
    the record's parts add up to the simulated step time."""
    env = user_env(PYTHONPATH=str(REPO_ROOT))
    follow_section("## A new cost term", tmp_path, env)
    (summary,) = iter_summaries(tmp_path / "runs", "cost_terms")
    assert summary.status == "ok" and summary.method == "dcp"
    steps = [
        json.loads(ln)
        for ln in (tmp_path / "runs" / "cost_terms" / summary.run_id / "steps.jsonl")
        .read_text()
        .splitlines()
    ]
    assert len(steps) == 2
    for st in steps:
        ex = st["extra"]
        assert ex["added_parts"]["checkpoint_io_s"] == "checkpoint offload I/O"
        keys = ("compute_s", "recompute_s", "comm_s", *ex["added_parts"], "sync_s", "idle_s")
        parts = [ex[k] for k in keys]
        assert sum(parts) == pytest.approx(ex["sim_step_time_s"], rel=1e-9)
    # what the script prints: the new column beside the others, as the report reads the records
    out = subprocess.run(
        [sys.executable, "try_cost_term.py", "runs", "cost_terms"],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    assert out.splitlines()[0].split() == [
        "step",
        "compute_s",
        "recompute_s",
        "comm_s",
        "checkpoint_io_s",
        "sync_s",
        "idle_s",
    ]
