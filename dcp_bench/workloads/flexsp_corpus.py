"""FlexSP's corpora as its solver reads them: ordered global batches of a length list.

FlexSP (ASPLOS'25) publishes its length samples with its solver: PKU-DAIR/Hetu-Galvatron, branch
``flexsp``, commit b4666892, ``galvatron/datasets/{github,common_crawl,wikipedia}.txt`` (one
length per line). Its driver (``galvatron/flexsp_solver/solver.py``, cited ``solver.py:LINE``)
reads a list in file order, pads every length up to a multiple of ``2 x world size`` and keeps
it only when the padded length is at most ``max length - 2 x world size``, the max length being
``seq_limit_k x 1000`` (``read_dataset``, solver.py:991-1003, 1160-1161): sequences over the max
length are dropped. Iteration ``i`` is the consecutive slice ``[i x GBS, (i + 1) x GBS)``
(``get_global_batch``, solver.py:1005-1006); the driver runs ``iter_num`` iterations from
``start_iter`` (solver_all.sh: 40 iterations, GBS 512; ``start_iter`` left at its default 3,
solver.py:1049).

The lists are read where they lie (never copied into the project); each known list is pinned by
its SHA-256 so a result names exactly what it read.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from dcp_bench.batch import GlobalBatch
from dcp_bench.errors import WorkloadError
from dcp_bench.workloads.base import distribution_stats

UPSTREAM = "PKU-DAIR/Hetu-Galvatron@b4666892601f1adab345dbf07b6af2c300eb7c90"
# SHA-256 of the lists as published (the file at galvatron/datasets/NAME.txt of UPSTREAM).
KNOWN_SHA256 = {
    "wikipedia": "50cb24ddf5a6cc0c36daabeeb82e61af727f9dbb557f539ef266bb529a51c960",
}
CORPORA = ("github", "common_crawl", "wikipedia")


@dataclass(frozen=True)
class FlexSPCorpus:
    """One corpus read FlexSP's way: the kept (padded) lengths in file order, and where they
    came from."""

    name: str
    lengths: np.ndarray  # int64, padded, in file order, over-long ones dropped
    read: int  # lengths in the file
    dropped: int  # over the max length (solver.py:1000)
    path: str
    sha256: str
    seq_limit_k: int
    world_size: int

    def batches(self, gbs: int, start_iter: int, iters: int) -> list[GlobalBatch]:
        """FlexSP's iterations ``start_iter .. start_iter + iters - 1`` (solver.py:1005-1006,
        1168-1169); sample ids are indices into the kept list."""
        out = []
        for it in range(start_iter, start_iter + iters):
            lo, hi = it * gbs, (it + 1) * gbs
            if hi > len(self.lengths):
                raise WorkloadError(
                    f"iteration {it} needs lengths {lo}..{hi - 1}; corpus {self.name!r} keeps "
                    f"{len(self.lengths)} at max length {self.seq_limit_k}K"
                )
            ids = np.arange(lo, hi, dtype=np.int64)
            tokens = self.lengths[lo:hi]
            out.append(GlobalBatch(it, ids, tokens, np.ones_like(tokens)))
        return out

    def provenance(self) -> dict[str, object]:
        return {
            "corpus": self.name,
            "upstream": f"{UPSTREAM} galvatron/datasets/{self.name}.txt",
            "path": self.path,
            "sha256": self.sha256,
            "lengths_read": self.read,
            "dropped_over_max": self.dropped,
            "rule": "solver.py:991-1006 (pad to 2 x world, drop over max - 2 x world)",
        }


def read_flexsp_corpus(
    name: str, path: str | Path, seq_limit_k: int, world_size: int
) -> FlexSPCorpus:
    """Read ``path`` (FlexSP's list ``name``) the way solver.py:991-1003 does. A known list
    whose bytes differ from the published one is refused."""
    if name not in CORPORA:
        raise WorkloadError(f"unknown FlexSP corpus {name!r}; expected one of {', '.join(CORPORA)}")
    if seq_limit_k <= 0 or world_size <= 0:
        raise WorkloadError(
            f"seq_limit_k={seq_limit_k}, world_size={world_size}; expected positive integers"
        )
    p = Path(path)
    if not p.is_file():
        raise WorkloadError(f"FlexSP corpus {name!r}: no file at {path}")
    raw = p.read_bytes()
    digest = hashlib.sha256(raw).hexdigest()
    if name in KNOWN_SHA256 and digest != KNOWN_SHA256[name]:
        raise WorkloadError(
            f"FlexSP corpus {name!r} at {path} has sha256 {digest}; expected the published "
            f"{KNOWN_SHA256[name]}"
        )
    data = np.array([int(v) for v in raw.split()], dtype=np.int64)
    step = 2 * world_size
    padded = ((data - 1) // step + 1) * step
    keep = padded <= seq_limit_k * 1000 - step
    return FlexSPCorpus(
        name=name,
        lengths=padded[keep],
        read=len(data),
        dropped=int((~keep).sum()),
        path=str(path),
        sha256=digest,
        seq_limit_k=seq_limit_k,
        world_size=world_size,
    )


class FlexSPCorpusWorkload:
    """FlexSP's iterations of one corpus as a run workload: step ``s`` of a run is FlexSP's
    iteration ``start_iter + s`` (GBS sequences in file order, solver.py:1005-1006), the same for
    every seed and method, so runs pair step by step. Built from a workload config
    (``dcp_bench/conf/workload/flexsp_*.yaml``); the list is read where it lies, once, when the
    workload is built.

    ``max_seq_len`` of the run's model is not applied on top: the corpus is already cut at
    ``seq_limit_k`` by FlexSP's own rule (a model whose limit is lower is refused at the first
    step, naming both)."""

    def __init__(
        self,
        name: str,
        corpus: str,
        lengths_file: str,
        seq_limit_k: int,
        world_size: int = 64,
        gbs: int = 512,
        start_iter: int = 3,
        seed: int = 0,
        version: str = "1",
        default_model: str = "gpt_7b",
        description: str | None = None,
        source: str | None = None,
        licence: str | None = None,
    ) -> None:
        for key, value, least in (
            ("gbs", gbs, 1),
            ("start_iter", start_iter, 0),
            ("world_size", world_size, 1),
        ):
            if isinstance(value, bool) or not isinstance(value, int) or value < least:
                raise WorkloadError(
                    f"workload {name!r}: {key}={value!r}; expected an integer >= {least}"
                )
        self.name = name
        self.kind = "text"
        self.version, self.default_model = str(version), str(default_model)
        self.length_scale = 1.0
        self.seed = int(seed)  # FlexSP's iterations do not depend on it
        self.gbs, self.start_iter = gbs, start_iter
        self.corpus = read_flexsp_corpus(corpus, lengths_file, int(seq_limit_k), world_size)
        self.description = description or (
            f"FlexSP's {corpus} iterations (GBS {gbs}, from iteration {start_iter}, sequences "
            f"over {seq_limit_k}K dropped; solver.py:991-1006)"
        )
        self.provenance: dict[str, object] = {
            **self.corpus.provenance(),
            "gbs": gbs,
            "start_iter": start_iter,
            "source": source or f"{UPSTREAM} galvatron/datasets/{corpus}.txt",
            **({"licence": licence} if licence else {}),
        }

    def length_distribution(self) -> tuple[np.ndarray, np.ndarray, str]:
        """(lengths, probabilities, method): the kept (padded) lengths, each with equal weight."""
        lengths = self.corpus.lengths.astype(np.float64)
        return lengths, np.full(len(lengths), 1.0 / len(lengths)), "exact"

    def stats(self) -> dict[str, Any]:
        """Statistics of the kept lengths (`dcp_bench.workloads.base.distribution_stats`), as
        `dcp-bench workloads show` prints them."""
        lengths, probs, method = self.length_distribution()
        out: dict[str, Any] = {"name": self.name, "version": self.version, "kind": self.kind}
        out["n"] = len(lengths)
        out.update(distribution_stats(lengths, probs, "linear"))
        out["stats_method"] = method
        out["length_scale"] = self.length_scale
        return out

    def global_batch(
        self, step: int, world_size: int, max_seq_len: int | None = None
    ) -> GlobalBatch:
        """FlexSP's iteration ``start_iter + step``."""
        if world_size != self.corpus.world_size:
            raise WorkloadError(
                f"workload {self.name!r}: read for {self.corpus.world_size} GPUs (FlexSP pads "
                f"lengths to 2 x world size); the run has {world_size}"
            )
        batch = self.corpus.batches(self.gbs, self.start_iter + int(step), 1)[0]
        longest = int(batch.tokens.max())
        if max_seq_len is not None and longest > max_seq_len:
            raise WorkloadError(
                f"workload {self.name!r}: iteration {batch.step} holds a {longest}-token "
                f"sequence; the model's max_seq_len is {max_seq_len}"
            )
        return GlobalBatch(
            int(step),
            batch.sample_ids,
            batch.tokens,
            batch.frames,
            info={"workload": self.name, "flexsp_iteration": batch.step, "gbs": self.gbs},
        )
