"""Where output goes (`dcp_bench.files`): only a regular file or a new path is written; a device,
a FIFO or a folder is refused and left as it is; a symbolic link is followed (its target is
replaced, the link stays); a write that fails (a full disk) leaves the previous content and no
temporary file."""

from __future__ import annotations

import errno
import os
import stat
from pathlib import Path

import pytest

from dcp_bench.errors import OutputError
from dcp_bench.files import atomic_write_text, output_problem


def _leftovers(folder: Path) -> list[str]:
    return sorted(p.name for p in folder.iterdir() if p.name.endswith(".tmp"))


@pytest.mark.skipif(not Path("/dev/full").exists(), reason="needs /dev/full")
def test_a_device_is_refused_and_stays_a_device() -> None:
    assert output_problem("/dev/full", folder=False) == "is a device, not a regular file"
    with pytest.raises(OutputError, match="'/dev/full' is a device, not a regular file"):
        atomic_write_text("/dev/full", "x")
    assert stat.S_ISCHR(os.stat("/dev/full").st_mode)


def test_a_fifo_is_refused_without_blocking(tmp_path: Path) -> None:
    fifo = tmp_path / "pipe"
    os.mkfifo(fifo)
    assert output_problem(fifo, folder=False) == "is a FIFO (named pipe), not a regular file"
    with pytest.raises(OutputError, match="FIFO"):
        atomic_write_text(fifo, "x")
    assert stat.S_ISFIFO(os.stat(fifo).st_mode)
    assert _leftovers(tmp_path) == []


def test_a_folder_is_refused_where_a_file_is_wanted(tmp_path: Path) -> None:
    (tmp_path / "d").mkdir()
    assert output_problem(tmp_path / "d", folder=False) == "is a folder, not a file"
    with pytest.raises(OutputError, match="is a folder, not a regular file"):
        atomic_write_text(tmp_path / "d", "x")
    assert (tmp_path / "d").is_dir()


def test_a_symlink_is_followed_its_target_replaced_and_the_link_kept(tmp_path: Path) -> None:
    (tmp_path / "real.txt").write_text("old")
    link = tmp_path / "link.txt"
    link.symlink_to("real.txt")
    assert output_problem(link, folder=False) is None
    atomic_write_text(link, "new")
    assert link.is_symlink() and os.readlink(link) == "real.txt"
    assert (tmp_path / "real.txt").read_text() == "new"


def test_a_dangling_symlink_creates_its_target(tmp_path: Path) -> None:
    link = tmp_path / "link.txt"
    link.symlink_to("made.txt")
    atomic_write_text(link, "new")
    assert link.is_symlink() and (tmp_path / "made.txt").read_text() == "new"


def test_a_symlink_to_a_device_is_refused(tmp_path: Path) -> None:
    fifo = tmp_path / "pipe"
    os.mkfifo(fifo)
    (tmp_path / "link").symlink_to(fifo)
    assert output_problem(tmp_path / "link", folder=False) == (
        "is a FIFO (named pipe), not a regular file"
    )
    with pytest.raises(OutputError, match="FIFO"):
        atomic_write_text(tmp_path / "link", "x")


def test_a_full_disk_leaves_the_old_content_and_no_temporary_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    target = tmp_path / "out.json"
    target.write_text("old")

    def no_space(fd: int) -> None:
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(os, "fsync", no_space)
    with pytest.raises(OutputError) as caught:
        atomic_write_text(target, "new content")
    message = str(caught.value)
    assert "out.json" in message and "No space left on device" in message
    assert "\n" not in message
    assert target.read_text() == "old"
    assert _leftovers(tmp_path) == []


def _no_space(fd: int) -> None:
    raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))


PLAN = ["workload=videosys_zipf", "method=dcp", "cluster=h200x8", "model=stdit3_xl2"]
SIM = [*PLAN, "steps=1", "warmup_steps=0"]


def _cli(args: list[str]) -> tuple[int, str]:
    import contextlib
    import io

    from dcp_bench.cli import main

    err = io.StringIO()
    with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
        code = main(args)
    return code, err.getvalue()


def test_plan_out_on_a_full_disk_is_one_line_and_keeps_the_old_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    out = tmp_path / "plan.json"
    out.write_text("old")
    monkeypatch.setattr(os, "fsync", _no_space)
    code, err = _cli(["plan", *PLAN, "--out", str(out)])
    assert code == 2
    assert err.count("\n") == 1 and "Traceback" not in err
    assert "plan.json" in err and "No space left on device" in err
    assert out.read_text() == "old" and _leftovers(tmp_path) == []


def test_plan_out_through_a_symlink_replaces_its_target(tmp_path: Path) -> None:
    (tmp_path / "real.json").write_text("old")
    (tmp_path / "link.json").symlink_to("real.json")
    code, err = _cli(["plan", *PLAN, "--out", str(tmp_path / "link.json")])
    assert code == 0, err
    assert (tmp_path / "link.json").is_symlink()
    assert (tmp_path / "real.json").read_text().startswith("{")


def test_a_sweep_on_a_full_disk_is_one_line(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # the run's forked process inherits the full disk: it exits without a traceback and the
    # sweep's own write of the unfinished run says why, on one line
    monkeypatch.setattr(os, "fsync", _no_space)
    code, err = _cli(["sweep", *SIM, "run.repeats=1", f"root={tmp_path / 'runs'}", "--no-progress"])
    assert code == 2, err
    lines = err.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in err, err
    assert "No space left on device" in lines[0] and "nothing written" in lines[0]
