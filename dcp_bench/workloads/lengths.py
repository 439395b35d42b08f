"""Length-list size sources: a derived fixture (``workloads/data/<name>_lengths.json``) or a user's
lengths file or text dataset, each a finite list of lengths drawn with replacement."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from dcp_bench.corpora import read_lengths_file, read_text_dataset
from dcp_bench.errors import WorkloadError
from dcp_bench.workloads.base import (
    DATA_DIR,
    MAX_SAMPLE_TOKENS,
    SizeSource,
    check_length,
    data_file_provenance,
    read_data_json,
)


class ListSource(SizeSource):
    """A finite list of lengths; id = index into the list, drawn uniformly with replacement."""

    quantile_method = "linear"

    def __init__(self, lengths: Any, where: str = "length list"):
        arr = lengths if isinstance(lengths, np.ndarray) else None
        if arr is not None and arr.ndim == 1 and arr.size and np.issubdtype(arr.dtype, np.integer):
            bad = np.flatnonzero((arr < 1) | (arr > MAX_SAMPLE_TOKENS))
            if bad.size:
                check_length(arr[bad[0]], f"{where}, length {bad[0] + 1}")  # raises, naming it
            self.lengths = arr.astype(np.int64)
            return
        try:
            values = list(lengths) if arr is None or arr.ndim == 1 else []
        except TypeError:
            values = []
        if not values:
            raise WorkloadError(f"{where}: expected a non-empty list of positive integer lengths")
        # Checked as Python numbers first: a huge value must be named, not overflow int64.
        self.lengths = np.asarray(
            [check_length(v, f"{where}, length {i + 1}") for i, v in enumerate(values)],
            dtype=np.int64,
        )

    def draw(self, rng: np.random.Generator, n: int) -> np.ndarray:
        return rng.integers(0, len(self.lengths), n, dtype=np.int64)

    def shapes(self, ids: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        lengths = self.lengths[np.asarray(ids, dtype=np.int64)]
        return np.ones_like(lengths), lengths

    def support(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        p = np.full(len(self.lengths), 1.0 / len(self.lengths))
        return np.ones_like(self.lengths), self.lengths, p

    def population(self) -> int:
        return int(len(self.lengths))


def fixture_source(name: str) -> tuple[SizeSource, dict[str, Any]]:
    data = read_data_json(DATA_DIR / f"{name}_lengths.json")
    prov = dict(data["provenance"])
    prov["fixture"] = f"workloads/data/{name}_lengths.json"
    prov.update(
        data_file_provenance(
            DATA_DIR / f"{name}_lengths.json", f"workloads/data/{name}_lengths.json"
        )
    )
    return ListSource(np.array(data["lengths"])), prov


def lengths_file_source(
    path: str | None = None,
    lengths_file: str | None = None,
    column: str | None = None,
    tokenizer: str | None = None,
    text_field: str = "text",
) -> tuple[SizeSource, dict[str, Any]]:
    file = path or lengths_file
    if not file:
        raise WorkloadError("workload 'lengths_file' needs a file: workload.lengths_file=PATH")
    p = Path(file).expanduser()
    if tokenizer:
        lengths = read_text_dataset(p, tokenizer, text_field)
        unit = f"{tokenizer} tokens of field {text_field!r}"
    else:
        lengths = read_lengths_file(p, column)
        unit = "lengths as given in the file"
    prov = {
        "source": str(file),
        **data_file_provenance(p, str(file)),
        "unit": unit,
        "licence": "not stated (say it with licence: in the workload config)",
    }
    return ListSource(lengths, where=str(p)), prov
