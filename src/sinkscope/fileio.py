"""Atomic file writes: a reader sees the old file or the new one, never half of one."""

from __future__ import annotations

import hashlib
import os
import tempfile
from pathlib import Path


def _default_file_mode() -> int:
    """Return the mode a newly created file would get (0o666 minus umask)."""
    umask = os.umask(0o022)
    os.umask(umask)
    return 0o666 & ~umask


def atomic_write_bytes(path: Path, data: bytes) -> None:
    """Write ``data`` to ``path`` atomically (temp file in same dir + replace).

    The file gets ordinary permissions (``0o666`` minus the umask), not the
    private ``0o600`` of the temporary file.

    Args:
        path: Destination file.
        data: Content to write.
    """
    path = Path(path)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        if hasattr(os, "fchmod"):
            os.fchmod(fd, _default_file_mode())
        with os.fdopen(fd, "wb") as handle:
            handle.write(data)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def sha256_bytes(data: bytes) -> str:
    """Return the hex SHA-256 of ``data``."""
    return hashlib.sha256(data).hexdigest()


def replace_folder(stage: Path, folder: Path) -> None:
    """Put the complete folder ``stage`` in place of ``folder`` (which may not exist).

    Two renames: ``folder`` moves aside to ``.NAME.old-PID``, ``stage`` takes its name, the old
    copy is removed. A reader sees the old folder or the new one; a crash between the renames
    leaves the old one beside the new name, never a half-written folder.
    """
    import shutil

    folder, stage = Path(folder), Path(stage)
    old = None
    if folder.exists():
        old = folder.parent / f".{folder.name}.old-{os.getpid()}"
        shutil.rmtree(old, ignore_errors=True)
        os.replace(folder, old)
    os.replace(stage, folder)
    if old is not None:
        shutil.rmtree(old, ignore_errors=True)


def atomic_write_text(path: Path, text: str) -> None:
    """Write UTF-8 ``text`` to ``path`` atomically."""
    atomic_write_bytes(path, text.encode("utf-8"))
