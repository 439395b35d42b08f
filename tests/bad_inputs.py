"""Bad inputs a new user might type, each with the words its one-line error must contain.

`tests/test_bad_inputs.py` runs every row through the CLI and checks: exit status 2, exactly one
line on stderr, naming the value (and, where it helps, what was expected). Run this file to print
the table with the messages this checkout gives (``python tests/bad_inputs.py``); the committed
copy is docs/bad_inputs.md.

``{data}`` in an argument is replaced by a folder of small lengths files (`write_data`), and
``{too_many}`` by a rank count above what this machine may start.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

SIM = [
    "simulate",
    "workload=videosys_zipf",
    "method=dcp",
    "cluster=h200x8",
    "model=stdit3_xl2",
    "steps=1",
    "warmup_steps=0",
]
TEXT = ["simulate", "method=dcp", "cluster=h200x8", "model=llama3_8b", "steps=1", "warmup_steps=0"]
TRAIN = ["train", "workload=sharegpt", "method=dcp", "model=tiny_llama"]

# (arguments, words the message must contain)
BAD_INPUTS: list[tuple[list[str], list[str]]] = [
    # config groups and keys
    ([*SIM[:1], "workload=nosuch", *SIM[2:]], ["nosuch", "valid choices"]),
    ([*SIM[:2], "method=nosuch", *SIM[3:]], ["nosuch", "valid choices"]),
    ([*SIM[:3], "cluster=h300x8", *SIM[4:]], ["h300x8", "valid choices"]),
    ([*SIM[:4], "model=gpt5", *SIM[5:]], ["gpt5", "valid choices"]),
    ([*SIM, "run.nosuch=1"], ["run.nosuch"]),
    ([*SIM, "colour=blue"], ["colour"]),
    ([*SIM, "steps"], ["steps", "key=value"]),
    ([*SIM, "run_timeout_s=20"], ["run_timeout_s", "run.timeout_s"]),
    ([*SIM, "lengths_file=x.txt"], ["lengths_file", "workload.lengths_file"]),
    # numbers of the run
    ([*SIM[:5], "warmup_steps=0", "steps=0"], ["steps", "=0", ">= 1"]),
    ([*SIM[:5], "warmup_steps=0", "steps=-1"], ["steps", "-1", ">= 1"]),
    ([*SIM[:5], "warmup_steps=0", "steps=abc"], ["steps", "abc", "integer"]),
    ([*SIM[:5], "warmup_steps=0", "steps=2.5"], ["steps", "2.5", "integer"]),
    ([*SIM, "seed=abc"], ["seed", "abc", "integer"]),
    ([*SIM, "seed=-3"], ["seed", "-3", ">= 0"]),
    ([*SIM, "seed=1.5"], ["seed", "1.5", "integer"]),
    ([*SIM[:6], "warmup_steps=-1"], ["warmup_steps", "-1", ">= 0"]),
    ([*SIM, "nproc=20"], ["nproc", "20", "whole nodes of 8"]),
    (
        [
            "simulate",
            "workload=videosys_zipf",
            "method=dcp",
            "cluster=h200x8@20",
            "model=stdit3_xl2",
            "steps=1",
        ],
        ["cluster=NAME@N", "20", "whole nodes of 8"],
    ),
    (
        [
            "simulate",
            "workload=videosys_zipf",
            "method=dcp",
            "cluster=h200x8@0",
            "model=stdit3_xl2",
            "steps=1",
        ],
        ["cluster=h200x8@0", "GPU count"],
    ),
    ([*SIM, "nproc=0"], ["nproc", "0", ">= 1"]),
    ([*SIM, "timeout_s=-5"], ["timeout_s", "-5", "> 0"]),
    ([*SIM, "timeout_s=abc"], ["timeout_s", "abc", "number"]),
    ([*SIM, "run.kill_grace_s=-1"], ["kill_grace_s", "-1"]),
    ([*SIM, "planner_clock=sometimes"], ["planner_clock", "sometimes", "overlap"]),
    ([*SIM, "run.executor=gpu"], ["executor", "gpu", "sim"]),
    ([*SIM, "mem_cap_fraction=1.5"], ["mem_cap_fraction", "1.5"]),
    ([*SIM, "mem_cap_fraction=0"], ["mem_cap_fraction", "0"]),
    ([*SIM, "cost.source=magic"], ["cost.source", "magic", "analytical"]),
    ([*SIM, "++cost.scales.flux=2"], ["flux", "act_bytes"]),
    ([*SIM, "++cost.scales.act_bytes=-1"], ["act_bytes", "-1", "> 0"]),
    ([*SIM, "run.noise.jitter_sigma=-0.1"], ["jitter_sigma", "-0.1"]),
    ([*SIM, "run.noise.straggler_prob=2"], ["straggler_prob", "2"]),
    ([*SIM, "method.mode=weird"], ["mode", "weird", "fair"]),
    # workloads and their lengths
    ([*TEXT, "workload=lengths_file"], ["lengths_file", "workload.lengths_file=PATH"]),
    (
        [*TEXT, "workload=lengths_file", "workload.lengths_file={data}/missing.txt"],
        ["missing.txt", "does not exist"],
    ),
    (
        [*TEXT, "workload=lengths_file", "workload.lengths_file={data}/big.txt"],
        ["big.txt", "1000000000000", "1,073,741,824"],
    ),
    (
        [*TEXT, "workload=lengths_file", "workload.lengths_file={data}/huge.txt"],
        ["huge.txt", "100000000000000000000", "1,073,741,824"],
    ),
    (
        [*TEXT, "workload=lengths_file", "workload.lengths_file={data}/negative.txt"],
        ["negative.txt", "-5", "positive"],
    ),
    (
        [*TEXT, "workload=lengths_file", "workload.lengths_file={data}/words.txt"],
        ["words.txt", "abc", "integer"],
    ),
    (
        [*TEXT, "workload=lengths_file", "workload.lengths_file={data}/fraction.txt"],
        ["fraction.txt", "3.5", "integer"],
    ),
    (
        [*TEXT, "workload=lengths_file", "workload.lengths_file={data}/empty.txt"],
        ["empty.txt", "no lengths"],
    ),
    (
        [*TEXT, "workload=lengths_file", "workload.lengths_file={data}/bad.json"],
        ["bad.json", "JSON"],
    ),
    ([*TEXT, "workload=synthetic_fixed", "workload.length=0"], ["length", "0", "positive"]),
    (
        [*TEXT, "workload=synthetic_fixed", "workload.length=2000000000"],
        ["length", "2000000000", "1,073,741,824"],
    ),
    (
        [*TEXT, "workload=synthetic_uniform", "workload.low=100", "workload.high=10"],
        ["low=100", "high=10"],
    ),
    ([*SIM, "workload.length_scale=0.5"], ["length_scale", "0.5", ">= 1"]),
    ([*SIM, "workload.tokens_per_gpu=0"], ["tokens_per_gpu", "0"]),
    (
        [*SIM, "workload.tokens_per_gpu=100000000000000000000"],
        ["tokens_per_gpu", "100000000000000000000"],
    ),
    ([*SIM, "workload.max_len_policy=chop"], ["max_len_policy", "chop", "truncate"]),
    # real training: refused before anything is launched
    ([*TRAIN, "nproc={too_many}"], ["(nproc)={too_many}", "at most", "ranks"]),
    ([*TRAIN, "nproc=2", "train.fail_rank=5"], ["fail_rank=5", "< 2"]),
    (
        [*TRAIN, "nproc=2", "train.fail_rank=0", "train.fail_step=100", "steps=2"],
        ["fail_step=100", "< 4"],
    ),
    ([*TRAIN, "nproc=2", "lr=-1"], ["train.lr", "-1", "> 0"]),
    ([*TRAIN, "nproc=2", "threads=0"], ["train.threads", "0", ">= 1"]),
    ([*TRAIN, "nproc=2", "nnodes=2"], ["nnodes", "rdzv_endpoint=HOST:PORT"]),
    ([*TRAIN, "nproc=2", "rdzv_endpoint=nohostport"], ["rdzv_endpoint", "nohostport", "HOST:PORT"]),
    ([*TRAIN, "nproc=2", "train.colour=red"], ["train.colour", "no key"]),
    ([*TRAIN, "nproc=2", "train.fail_rank=abc"], ["fail_rank", "abc", "integer"]),
    (["train", "method=dcp", "nproc=2"], ["workload=NAME"]),
    # sweeps, reproduce, report, plan, workloads
    (["sweep", *SIM[1:], "run.repeats=0"], ["run.repeats", "0", ">= 1"]),
    (["sweep", *SIM[1:], "--jobs", "0"], ["jobs", "0", ">= 1"]),
    (["reproduce", "sections=nosuch"], ["nosuch", "claim"]),
    (["reproduce", "sections=claim,nosuch"], ["nosuch", "claim"]),
    (["reproduce", "budget_s=abc"], ["budget_s", "abc", "number"]),
    (["reproduce", "budget_s=-5"], ["budget_s", "-5", ">= 1"]),
    (["reproduce", "budget_s=nan"], ["budget_s", "nan"]),
    (["reproduce", "jobs=0"], ["jobs", "0", ">= 1"]),
    (["reproduce", "claim=flexps"], ["claim", "flexps", "dcp, flexsp, flexsp_deepspeed"]),
    (["reproduce", "claim=flexsp", "preset=real"], ["claim", "flexsp", "preset="]),
    (["reproduce", "claim=flexsp", "steps=0"], ["steps", "0", ">= 1"]),
    (["reproduce", "repeats=x"], ["repeats", "x", "integer"]),
    (["reproduce", "real=maybe"], ["real", "maybe", "true or false"]),
    (["reproduce", "retry_failed=perhaps"], ["retry_failed", "perhaps", "true or false"]),
    (["reproduce", "budget_s=30", "report_reserve_s=60"], ["report_reserve_s", "budget_s"]),
    (["reproduce", "speed=fast"], ["speed=fast", "budget_s"]),
    (["reproduce", "config={data}/missing.yaml"], ["missing.yaml", "not found"]),
    (["reproduce", "claims={data}/missing.yaml"], ["missing.yaml", "not found"]),
    (["report", "campaign=nothing", "root={data}"], ["nothing", "no complete runs"]),
    (["report", "colour=blue"], ["colour=blue", "campaign"]),
    (["plan", *SIM[1:5], "step=abc"], ["step", "abc", "integer"]),
    (["plan", *SIM[1:5], "step=-1"], ["step", "-1", "non-negative"]),
    (["workloads", "show", "nosuch"], ["nosuch", "valid"]),
    (["frobnicate"], ["frobnicate", "invalid choice"]),
    # issue 27: values that parse as YAML collections, campaign names, output places
    ([*SIM, "run.campaign={a: 1}"], ["run.campaign", "mapping", "single value"]),
    (
        [*TEXT, "workload=lengths_file", "workload.lengths_file={a: 1}"],
        ["workload.lengths_file", "mapping"],
    ),
    (
        [*TEXT, "workload=lengths_file", "workload.lengths_file=[1,2,3]"],
        ["workload.lengths_file", "list"],
    ),
    ([*SIM[:2], "method=bucket_static", *SIM[3:], "method.sp={x: 1}"], ["method.sp", "mapping"]),
    ([*SIM, "run.campaign=../../x"], ["run.campaign", "../../x", "one folder name"]),
    ([*SIM, "run.campaign=/tmp/x"], ["run.campaign", "/tmp/x", "one folder name"]),
    ([*SIM, "run.campaign=" + "c" * 300], ["run.campaign", "1 to 100 characters"]),
    ([*SIM, "run.campaign=caf\u00e9"], ["run.campaign=caf\u00e9", "quoted value"]),
    ([*SIM, "--record", "root={data}/big.txt"], ["run.root", "big.txt", "not a folder"]),
    ([*SIM, "--record", "root={data}/big.txt/runs"], ["run.root", "big.txt", "not a folder"]),
    (["sweep", *SIM[1:], "root={data}/big.txt"], ["run.root", "big.txt", "not a folder"]),
    (
        ["report", "campaign=nothing", "root={data}", "out={data}/big.txt"],
        ["out=", "big.txt", "not a folder"],
    ),
    (
        ["report", "campaign=nothing", "root={data}", "n_boot=99999999999999999999"],
        ["n_boot", "99999999999999999999"],
    ),
    (["report", "campaign=nothing", "root={data}", "n_boot=0"], ["n_boot", "'0'", "from 1"]),
    (
        ["plan", *SIM[1:5], "--out", "{data}/big.txt/plan.json"],
        ["--out", "big.txt", "not a folder"],
    ),
    (
        ["workloads", "show", "prolong", "--plot", "{data}/big.txt/x.png"],
        ["--plot", "big.txt", "not a folder"],
    ),
    (
        ["slurm", "workload=sharegpt", "method=dcp", "cluster=h200x32", "--time", "2 hours"],
        ["--time", "2 hours"],
    ),
    (
        ["slurm", "workload=sharegpt", "method=dcp", "cluster=h200x32", "--partition", "a b"],
        ["--partition", "a b"],
    ),
    (
        [
            "slurm",
            "workload=sharegpt",
            "method=dcp",
            "cluster=h200x32",
            "--out",
            "{data}/big.txt/job.sbatch",
        ],
        ["--out", "big.txt", "not a folder"],
    ),
    (["reproduce", "out={data}/big.txt"], ["out=", "big.txt", "not a folder"]),
    (["reproduce", "root={data}/big.txt"], ["root=", "big.txt", "not a folder"]),
    (["reproduce", "campaign=../x"], ["campaign", "../x", "one folder name"]),
    # user config and user code
    ([*SIM, "extra_conf={data}/big.txt"], ["big.txt", "is a file, not a folder"]),
    (
        [*SIM[:2], "method=broken_yaml", *SIM[3:], "extra_conf={data}/conf"],
        ["broken_yaml.yaml", "line 2", "YAML"],
    ),
    (
        [*SIM[:2], "method=dcp", *SIM[3:], "extra_conf={data}/shadow"],
        ["shadow/method/dcp.yaml", "conf/method/dcp.yaml"],
    ),
    (
        [*SIM[:2], "method=raises_at_import", *SIM[3:], "extra_conf={data}/conf"],
        ["raises_at_import_planner", "RuntimeError", "raises_at_import_planner.py:1"],
    ),
    (
        ["plan", *SIM[1:2], "method=returns_none", *SIM[3:5], "extra_conf={data}/conf"],
        ["returned NoneType", "StepPlan"],
    ),
    # numbers checked before anything runs
    ([*TEXT, "workload=prolong", "model.num_layers=0"], ["model.num_layers=0", ">= 1"]),
    ([*TEXT, "workload=prolong", "model.heads=-8"], ["model.heads=-8", ">= 1"]),
    ([*SIM, "workload.length_scale=inf"], ["length_scale", "inf", "finite"]),
    ([*SIM, "workload.length_scale=nan"], ["length_scale", "nan", "finite"]),
    (["profile", "model=tiny_llama", "nproc=3"], ["nproc=3", "power of two"]),
    (["profile", "model=tiny_llama", "nproc=[2,x]"], ["nproc='x'", "power of two"]),
    # issue 37: output targets that are not regular files
    (["plan", *SIM[1:5], "--out", "/dev/full"], ["--out='/dev/full'", "device", "regular file"]),
    (["plan", *SIM[1:5], "--out", "{data}/fifo"], ["fifo", "FIFO", "regular file"]),
    (["plan", *SIM[1:5], "--out", "{data}/conf"], ["--out", "conf", "is a folder"]),
    (["workloads", "show", "prolong", "--plot", "/dev/full"], ["--plot", "device"]),
    (["workloads", "show", "prolong", "--plot", "{data}/x.xyz"], ["x.xyz", "'.xyz'", ".png"]),
    (["workloads", "show", "prolong", "--plot", "{data}/plot"], ["plot", "no suffix", ".svg"]),
    (["validate", "--out", "{data}/big.txt"], ["--out", "big.txt", "not a folder"]),
    (["profile", "model=tiny_llama", "out=/dev/full"], ["out='/dev/full'", "device"]),
    # issue 37: sizes with upper bounds, numbers written one way
    ([*SIM[:5], "warmup_steps=0", "steps=1e9"], ["steps", "1000000000.0", "100,000"]),
    ([*SIM[:5], "steps=1", "warmup_steps=1e9"], ["warmup_steps", "100,000"]),
    ([*SIM[:5], "warmup_steps=0", "steps=1000000000"], ["steps", "1000000000", "100,000"]),
    ([*SIM[:5], "warmup_steps=0", "steps=1e3"], ["steps", "1000.0", "decimal number"]),
    (["sweep", *SIM[1:], "run.repeats=1e9", "--dry-run"], ["run.repeats", "at most 1,000"]),
    (["sweep", *SIM[1:], "repeats=1000000000", "--dry-run"], ["1000000000", "at most 1,000"]),
    (["reproduce", "repeats=1e20"], ["repeats", "1e20", "at most 1,000"]),
    (["reproduce", "repeats=100000000000000000000"], ["repeats", "at most 1,000"]),
    (["reproduce", "budget_s=1e300"], ["budget_s", "1e300", "604,800"]),
    (["reproduce", "jobs=100000"], ["jobs", "100000", "1,024"]),
    ([*SIM[:3], "cluster=h200x8@1073741824", *SIM[4:]], ["cluster=NAME@N", "131,072"]),
    ([*SIM, "nproc=1073741824"], ["nproc", "1073741824", "131,072"]),
    ([*SIM, "seed=99999999999"], ["seed", "99999999999", "4,294,967,295"]),
    ([*SIM[:5], "warmup_steps=0", "steps=\u0661\u0660\u0660"], ["U+0661", "ASCII digit"]),
    ([*SIM[:5], "warmup_steps=0", "steps=1_000"], ["1_000", "expected 1000"]),
    (["reproduce", "repeats=\u0663"], ["repeats", "U+0663", "ASCII digit"]),
    ([*SIM, "steps=3"], ["steps=3", "given twice", "each key once"]),
    ([*SIM, "run.steps=3"], ["run.steps=3", "given twice", "steps=1"]),
    (["reproduce", "jobs=1", "jobs=2"], ["jobs", "given twice"]),
    # issue 37: per-method options checked when the config is parsed
    ([*SIM[:2], "method=bucket_static", *SIM[3:], "method.sp=abc"], ["method.sp='abc'", "integer"]),
    ([*SIM[:2], "method=bucket_static", *SIM[3:], "method.sp=nan"], ["method.sp=nan", "integer"]),
    ([*SIM[:2], "method=bucket_static", *SIM[3:], "method.sp=3"], ["method.sp=3", "power of two"]),
    (
        [*SIM[:2], "method=bucket_static", *SIM[3:], "method.max_batch_size=0"],
        ["method.max_batch_size=0", ">= 1"],
    ),
    (
        [*SIM[:2], "method=dcp_inter_pac", *SIM[3:], "method.eject=maybe"],
        ["method.eject='maybe'", "true or false"],
    ),
    (
        [*SIM[:2], "method=wlb_llm", *SIM[3:], "method.outlier_queues=-1"],
        ["method.outlier_queues=-1", "integer >= 0"],
    ),
    (
        [
            *TEXT[:3],
            "model=hf",
            *TEXT[4:],
            "workload=prolong",
            "model.config.num_attention_heads=7",
        ],
        ["num_attention_heads=7", "divides hidden_size"],
    ),
    # issue 37: the whole reproduction checked before its first run
    (["reproduce", "cluster=nosuch"], ["cluster='nosuch'", "valid choices"]),
    (["reproduce", "claims={data}/binary.yaml"], ["binary.yaml", "not UTF-8", "claims file"]),
    (["reproduce", "claims={data}/big.txt"], ["big.txt", "no list of claims"]),
    (["reproduce", "budget_s=30"], ["budget_s=30", "report_reserve_s"]),
    # issue 37: lengths files read strictly
    (
        [*TEXT, "workload=lengths_file", "workload.lengths_file={data}/grouped.txt"],
        ["grouped.txt", "1_000", "ASCII digits"],
    ),
    (
        [*TEXT, "workload=lengths_file", "workload.lengths_file={data}/arabic.txt"],
        ["arabic.txt", "ASCII digits"],
    ),
    (
        [*TEXT, "workload=lengths_file", "workload.lengths_file={data}/exponent.txt"],
        ["exponent.txt", "1e3", "ASCII digits"],
    ),
    (
        [*TEXT, "workload=lengths_file", "workload.lengths_file={data}/strings.json"],
        ["strings.json", "'100' is a string", "JSON number"],
    ),
    (
        [*TEXT, "workload=lengths_file", "workload.lengths_file={data}/sparse.txt"],
        ["sparse.txt", "NUL byte"],
    ),
]


def write_data(folder: Path) -> Path:
    """The small lengths files the table names."""
    folder.mkdir(parents=True, exist_ok=True)
    files = {
        "big.txt": "100\n1000000000000\n",
        "huge.txt": "100\n100000000000000000000\n",
        "negative.txt": "100\n-5\n",
        "words.txt": "100\nabc\n",
        "fraction.txt": "3.5\n",
        "empty.txt": "# none\n",
        "bad.json": "[1, 2,",
        "grouped.txt": "100\n1_000\n",
        "arabic.txt": "100\n\u0661\u0660\n",
        "exponent.txt": "100\n1e3\n",
        "strings.json": '["100", 200]',
    }
    for name, text in files.items():
        (folder / name).write_text(text)
    (folder / "binary.yaml").write_bytes(bytes(range(256)))
    with open(folder / "sparse.txt", "wb") as fh:
        fh.truncate(1 << 20)  # a sparse file: NUL bytes throughout
    if not (folder / "fifo").exists():
        os.mkfifo(folder / "fifo")
    # user config folders: a malformed YAML file, planners that break, one shadowing a packaged name
    methods = folder / "conf" / "method"
    methods.mkdir(parents=True, exist_ok=True)
    (methods / "broken_yaml.yaml").write_text("name: [\n")
    (methods / "raises_at_import.yaml").write_text(
        "name: raises_at_import\n_target_: raises_at_import_planner.Planner\nmode: fair\n"
    )
    (folder / "conf" / "raises_at_import_planner.py").write_text(
        "raise RuntimeError('broken on purpose')\n"
    )
    (methods / "returns_none.yaml").write_text(
        "name: returns_none\n_target_: returns_none_planner.NonePlanner\nmode: fair\n"
    )
    (folder / "conf" / "returns_none_planner.py").write_text(
        "from dcp_bench.planners.base import Planner\n\n\nclass NonePlanner(Planner):\n    name = "
        "'returns_none'\n\n    def __init__(self, mode='fair', **kw):\n        self.mode = "
        "mode\n\n    def plan(self, batch, cost):\n        return None\n"
    )
    (folder / "shadow" / "method").mkdir(parents=True, exist_ok=True)
    (folder / "shadow" / "method" / "dcp.yaml").write_text("name: dcp\n_target_: nowhere.Planner\n")
    return folder


def too_many_ranks() -> int:
    """A power of two above 4 ranks per usable core (docs/runtime.md: what one CPU node may
    start)."""
    cores = (
        len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    )
    n = 1
    while n <= 4 * cores:
        n *= 2
    return n


def fill(args: list[str], data: Path) -> list[str]:
    return [
        a.replace("{data}", str(data)).replace("{too_many}", str(too_many_ranks())) for a in args
    ]


def run_one(args: list[str]) -> tuple[int, str]:
    """(exit status, stderr) of ``dcp-bench ARGS`` run in this process."""
    import contextlib
    import io

    from dcp_bench.cli import main

    err, out = io.StringIO(), io.StringIO()
    with contextlib.redirect_stderr(err), contextlib.redirect_stdout(out):
        try:
            code = main(args)
        except SystemExit as exc:  # argparse
            code = int(exc.code or 0)
    return code, err.getvalue()


if __name__ == "__main__":
    import tempfile

    with tempfile.TemporaryDirectory() as tmp:
        data = write_data(Path(tmp) / "data")
        print("| # | input | exit | message |\n|---|---|---|---|")
        for i, (args, _) in enumerate(BAD_INPUTS, 1):
            real = fill(args, data)
            code, err = run_one(real)
            shown = " ".join(args).replace("|", "\\|")
            repo = str(Path(__file__).resolve().parents[1])
            msg = (
                err.strip()
                .replace(str(data), "{data}")
                .replace(repo + "/", "")
                .replace(repo, ".")
                .replace("|", "\\|")
            )
            print(f"| {i} | `dcp-bench {shown}` | {code} | {msg} |")
            sys.stdout.flush()
