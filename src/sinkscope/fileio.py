"""Atomic file writes: a reader sees the old file or the new one, never half of one.

Also the two guards every output folder shares: :func:`check_replaceable` (``--overwrite``
replaces only a folder that is ours, or an empty one) and :func:`exclusive_lock` (one writer
per output folder at a time).
"""

from __future__ import annotations

import hashlib
import os
import tempfile
from contextlib import contextmanager
from pathlib import Path
from typing import Callable, Iterator

from sinkscope.errors import SinkscopeError


def _default_file_mode() -> int:
    """Return the mode a newly created file would get (0o666 minus umask)."""
    umask = os.umask(0o022)
    os.umask(umask)
    return 0o666 & ~umask


def default_folder_mode() -> int:
    """Return the mode a newly created folder would get (0o777 minus umask); mkdtemp's is 0o700."""
    umask = os.umask(0o022)
    os.umask(umask)
    return 0o777 & ~umask


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


def check_replaceable(folder: Path, overwrite: bool, *, kind: str, is_ours: Callable[[Path], bool],
                      hint: str = "pass --overwrite") -> None:
    """Refuse an output ``folder`` that holds something, unless ``overwrite`` and it is one of ours.

    ``--overwrite`` replaces an empty folder or one that ``is_ours`` recognises (a run folder with
    our manifest, a trainer checkpoint), never a folder holding anything else: that could be the
    model being measured or a user's files.

    Args:
        folder: the output folder (need not exist).
        overwrite: whether the user asked to replace it.
        kind: what the folder is, for the messages ("run", "checkpoint").
        is_ours: recognises a folder this kind of command wrote.
        hint: what to do when it exists and ``overwrite`` is off.
    """
    folder = Path(folder)
    if folder.exists() and not folder.is_dir():
        raise SinkscopeError(f"{folder} exists and is not a folder; choose another --out.")
    if folder.is_dir() and any(folder.iterdir()):
        if not overwrite:
            raise SinkscopeError(f"the {kind} folder {folder} already exists and is not empty; {hint}, "
                                 "or choose another --out.")
        if not is_ours(folder):
            raise SinkscopeError(f"--overwrite only replaces a {kind} folder written by sinkscope or an empty folder, "
                                 f"and {folder} holds other files; choose another --out.")


@contextmanager
def exclusive_lock(path: Path, busy: Callable[[str], str]) -> Iterator[None]:
    """Hold an exclusive lock file at ``path`` for the ``with`` block; a second holder fails at once.

    The lock is ``flock`` on the file (released by the kernel if the process dies, so a kill
    leaves no stale lock); the file holds the owner's process id and is removed on release.
    ``busy(owner)`` gives the sentence of the :class:`SinkscopeError` raised when another
    process (or another ``with`` block) holds it.
    """
    import fcntl

    path = Path(path)
    while True:
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o666)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            owner = os.read(fd, 64).decode("ascii", "replace").strip() or "unknown"
            os.close(fd)
            raise SinkscopeError(busy(owner)) from None
        except BaseException:
            os.close(fd)
            raise
        try:  # the previous holder may have removed the file between our open and our flock
            same = os.fstat(fd).st_ino == os.stat(path).st_ino
        except FileNotFoundError:
            same = False
        if same:
            break
        os.close(fd)
    try:
        os.ftruncate(fd, 0)
        os.write(fd, f"{os.getpid()}\n".encode("ascii"))
        yield
    finally:
        try:
            path.unlink(missing_ok=True)  # while still locked, so no one locks a removed file for long
        finally:
            os.close(fd)
