"""Files every part of the suite writes or identifies: atomic writes and content hashes.

A write is atomic (temporary file in the same folder, fsync, rename over the target), so readers
and a process killed at any instant see either the previous complete content or the new one,
never a mix. Files are created with mode 0644 (readable by everyone, as reports and records are
meant to be shared), whatever the umask of ``tempfile`` would give.

Output targets: only a regular file or a new path is written. A device (``/dev/full``), a FIFO,
a socket or a folder where a file is wanted is refused (`OutputError`, one line) and left as it
is. A symbolic link is followed: the file it points to is replaced (atomically, in the target's
folder) and the link itself stays a link; a dangling link creates its target. A full disk or a
read-only place is one line too, and the temporary file is removed, so nothing is half-written
and the previous content (if any) is unchanged.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import stat
import tempfile
from pathlib import Path
from typing import Any

from dcp_bench.errors import ConfigError, OutputError

FILE_MODE = 0o644
NAME_MAX = 255  # bytes in one file or folder name (Linux, macOS)


def output_problem(path: str | os.PathLike[str], folder: bool) -> str | None:
    """Why ``path`` cannot receive output (a folder with ``folder``, else a file), or None: a
    name too long, an existing file where a folder is wanted (or the reverse), a place that
    cannot be created or written. Checked before work starts, so no work is lost to it."""
    path = Path(path)
    for part in path.parts:
        if len(os.fsencode(part)) > NAME_MAX:
            return (
                f"the name {part[:20]!r}... is {len(os.fsencode(part))} bytes long (at most "
                f"{NAME_MAX})"
            )
    if not folder and path.is_symlink():
        path = Path(os.path.realpath(path))  # a link is followed (module docstring)
    target = path if folder else path.parent
    if path.exists():
        if folder and not path.is_dir():
            return "exists and is not a folder"
        if not folder and path.is_dir():
            return "is a folder, not a file"
        if not folder and not path.is_file():
            return f"is a {_kind(path)}, not a regular file"
        if not folder and not os.access(path, os.W_OK):
            return "exists and is not writable"
    probe = target
    while not probe.exists():
        if probe.parent == probe:
            break
        probe = probe.parent
    if not probe.is_dir():
        return f"{str(probe)!r} is a file, not a folder"
    if not _writable(probe):
        return (
            "not writable"
            if probe == target
            else f"cannot be created: {str(probe)!r} is not writable"
        )
    return None


def _kind(path: Path) -> str:
    """What a path that is not a regular file or a folder is, in words."""
    mode = path.stat().st_mode
    if stat.S_ISCHR(mode) or stat.S_ISBLK(mode):
        return "device"
    if stat.S_ISFIFO(mode):
        return "FIFO (named pipe)"
    if stat.S_ISSOCK(mode):
        return "socket"
    return "special file"


def write_target(path: str | os.PathLike[str]) -> Path:
    """The file a write to ``path`` replaces: ``path``, or the file a symbolic link there points
    to; an `OutputError` when that exists and is not a regular file (nothing is touched)."""
    path = Path(path)
    if path.is_symlink():
        path = Path(os.path.realpath(path))
    if path.exists() and not path.is_file():
        what = "folder" if path.is_dir() else _kind(path)
        raise OutputError(f"{str(path)!r} is a {what}, not a regular file; nothing written")
    return path


def _writable(folder: Path) -> bool:
    """A file can be created in ``folder`` (tried: permission bits do not tell for a read-only
    mount or a privileged user)."""
    if not os.access(folder, os.W_OK | os.X_OK):
        return False
    try:
        fd, tmp = tempfile.mkstemp(prefix=".dcp-bench-probe-", dir=folder)
    except OSError:
        return False
    os.close(fd)
    os.unlink(tmp)
    return True


def check_output(
    path: str | os.PathLike[str], key: str, folder: bool = True, value: Any = None
) -> None:
    """`output_problem` as a `ConfigError` naming ``key=value`` (the path when no value)."""
    problem = output_problem(path, folder)
    if problem is not None:
        raise ConfigError(
            f"{key}={str(path) if value is None else value!r}: {problem}; expected a "
            f"{'folder' if folder else 'regular file (or a new path)'} this user can write"
        )


def atomic_write_bytes(path: str | os.PathLike[str], data: bytes) -> None:
    """Write ``data`` to ``path`` so that readers see the old or the new content, never a mix.
    Only a regular file or a new path is written, a symbolic link's target in its place (module
    docstring); a place that cannot take it (a device, a folder, a full disk, a read-only folder)
    is an `OutputError` naming the path and the reason, with nothing left behind."""
    path = write_target(path)
    tmp = None
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
        with os.fdopen(fd, "wb") as fh:
            fh.write(data)
            fh.flush()
            os.fsync(fh.fileno())
        os.chmod(tmp, FILE_MODE)  # mkstemp creates 0600
        write_target(path)  # still a regular file or absent just before the rename
        os.replace(tmp, path)
    except BaseException as exc:
        if tmp is not None and os.path.exists(tmp):
            os.unlink(tmp)
        if isinstance(exc, OSError):
            raise OutputError(
                f"cannot write {str(path)!r}: {exc.strerror or exc}; nothing written (a previous "
                "file there is unchanged)"
            ) from exc
        raise


def atomic_write_text(path: str | os.PathLike[str], text: str) -> None:
    """`atomic_write_bytes` for text (UTF-8)."""
    if not isinstance(text, str):
        raise TypeError(f"atomic_write_text needs a str, got {type(text).__name__}")
    atomic_write_bytes(path, text.encode())


def json_default(obj: Any) -> Any:
    """JSON for the values records hold besides plain types: dataclasses, numpy, paths."""
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        return dataclasses.asdict(obj)
    if hasattr(obj, "tolist"):  # numpy scalars and arrays
        return obj.tolist()
    if isinstance(obj, Path):
        return str(obj)
    raise TypeError(f"not JSON serialisable: {type(obj).__name__}")


def atomic_write_json(path: str | os.PathLike[str], obj: Any) -> None:
    """``obj`` as indented JSON with sorted keys, written atomically."""
    atomic_write_text(path, json.dumps(obj, indent=2, sort_keys=True, default=json_default) + "\n")


def sha256_file(path: str | os.PathLike[str]) -> str:
    """SHA-256 of a file's bytes (what ``sha256sum`` prints), read in 1 MiB chunks."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()
