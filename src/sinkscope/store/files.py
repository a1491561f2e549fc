"""Atomic file writes: a reader sees the old file or the new one, never half of one.

Also what every output folder shares, so that no writer deletes or overwrites a file sinkscope
did not write:

- :func:`write_inventory`: every folder a sinkscope writer fills (a run folder, a trainer
  checkpoint, a report, a sweep, the toy task's folder, a comparison of several models) records
  the files it wrote in a hidden ``.sinkscope-files`` (JSON), written last;
- :func:`foreign_entries`: what a folder holds that no sinkscope writer recorded (a user's notes,
  the model being measured, a symbolic link), found without following links;
- :func:`check_replaceable`: an output folder is written only when it is absent or empty, or,
  with ``--overwrite``, when everything in it is sinkscope's; a folder holding anything else is
  refused, with or without ``--overwrite``;
- :func:`check_inputs_outside`: the model, text file, tokenizer or recipe a command reads may
  not lie inside the folder it replaces;
- :func:`exclusive_lock`: one writer per output folder at a time, with a lock file that is
  created exclusively and never followed through a symbolic link or truncated.

And how every JSON file sinkscope did not just write is read: :func:`read_json` (and
:func:`parse_json` for JSON text inside another file) turns a file that is not UTF-8, not JSON,
nested too deeply (``[[[[...]]]]``, else a ``RecursionError``) or of the wrong top-level type
into one sentence naming the file.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import tempfile
from contextlib import ExitStack, contextmanager
from pathlib import Path
from typing import Callable, Iterable, Iterator

from sinkscope.errors import SinkscopeError, option
from sinkscope.runtime.paths import user_path


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


# ---- reading JSON: every failure is one sentence naming the file ---------------------------------------

#: the deepest nesting a JSON file sinkscope reads may have (its own files and models' configs and
#: tokenizers stay under 20); deeper is refused, so that no reader that recurses into the value
#: (transformers, ``json.dumps``, a deep copy) can hit Python's recursion limit later.
JSON_MAX_DEPTH = 100
#: the default end of the sentence: what to do about a damaged file.
JSON_HINT = "repair or replace it"


def _json_kind(value: object) -> str:
    """``a list``, ``a string``, ... for a message about a JSON value of the wrong type."""
    return {dict: "a JSON object", list: "a list", str: "a string", bool: "a boolean", int: "a number",
            float: "a number", type(None): "null"}.get(type(value), type(value).__name__)


def _nested_deeper(value: object, limit: int) -> bool:
    """Whether ``value`` (parsed JSON) nests lists and objects more than ``limit`` levels deep.

    Level by level, without recursion (a 9 MB tokenizer.json takes a tenth of its parse).
    """
    level = [value] if type(value) is dict or type(value) is list else []
    for _ in range(limit):
        if not level:
            return False
        level = [child for node in level for child in (node.values() if type(node) is dict else node)
                 if type(child) is dict or type(child) is list]
    return bool(level)


def try_parse_json(text: str) -> tuple[object, str | None]:
    """``(value, None)`` for JSON text, or ``(None, why it is not valid JSON)`` ("nested too deeply"); never raises.

    For a reader that words its own sentence; :func:`parse_json` and :func:`read_json` raise one.
    """
    try:
        value = json.loads(text)
    except RecursionError:
        return None, "nested too deeply"
    except json.JSONDecodeError as error:
        return None, f"{error.msg} at line {error.lineno} column {error.colno}"
    except (ValueError, TypeError) as error:  # e.g. an integer with more digits than int() converts
        return None, (str(error).splitlines() or [type(error).__name__])[0].split(";")[0][:120]
    if isinstance(value, (dict, list)) and text.count("[") + text.count("{") > JSON_MAX_DEPTH \
            and _nested_deeper(value, JSON_MAX_DEPTH):
        return None, f"nested too deeply, more than {JSON_MAX_DEPTH} levels"
    return value, None


def _check_type(value: object, expect: type | tuple[type, ...] | None) -> str | None:
    if expect is None or isinstance(value, expect):
        return None
    wanted = " or ".join(_json_kind(t()) for t in (expect if isinstance(expect, tuple) else (expect,)))
    return f"holds {_json_kind(value)} where {wanted} belongs"


def parse_json(text: str, what: str, *, expect: type | tuple[type, ...] | None = None,
               hint: str = JSON_HINT) -> object:
    """JSON ``text`` that sinkscope did not just write (a header inside a file), or one sentence.

    ``what`` names the text and where it lies ("the header of the state file X"); ``expect`` is
    the type the top-level value must have (``dict``); ``hint`` ends the sentence.
    """
    value, problem = try_parse_json(text)
    if problem is not None:
        raise SinkscopeError(f"{what} is not valid JSON ({problem}); {hint}.")
    wrong = _check_type(value, expect)
    if wrong is not None:
        raise SinkscopeError(f"{what} {wrong}; {hint}.")
    return value


def read_json(path: str | os.PathLike, what: str, *, expect: type | tuple[type, ...] | None = None,
              missing_ok: bool = False, hint: str = JSON_HINT) -> object:
    """The JSON file ``path``, read as UTF-8 and parsed; every failure is one :class:`SinkscopeError`.

    The sentence names the file and what it is ("``what`` at PATH is not valid JSON (why); ``hint``."):
    ``what`` is a noun phrase ("the model's config"), ``hint`` what to do about it. Refused: a file that cannot be read, is not
    UTF-8, is not valid JSON or nests deeper than :data:`JSON_MAX_DEPTH` (a file of
    ``[[[[...]]]]`` would otherwise be a ``RecursionError``), or whose top-level value is not of the
    type ``expect``. A missing file is None with ``missing_ok``, else one sentence too.
    """
    path = Path(path)
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        if missing_ok:
            return None
        raise SinkscopeError(f"there is no {what} at {path}; {hint}.") from None
    except OSError as error:
        raise SinkscopeError(f"could not read {what} at {path} ({error.strerror or error}); {hint}.") from None
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as error:
        raise SinkscopeError(f"{what} at {path} is not UTF-8 text (byte 0x{data[error.start]:02x} at offset "
                             f"{error.start}); {hint}.") from None
    return parse_json(text, f"{what} at {path}", expect=expect, hint=hint)


#: parsed JSON by (real path, device, inode, size, modification time): read_json_once's memory.
_READ_ONCE: dict[tuple, object] = {}


def read_json_once(path: str | os.PathLike, what: str, *, expect: type | tuple[type, ...] | None = None,
                   hint: str = JSON_HINT) -> object:
    """:func:`read_json`, read once per version of the file in this process (a model's config.json is
    asked for when the model is resolved, checked and loaded); a deep copy each time, so callers may
    change it. A failure is never remembered: each caller gets its own sentence."""
    import copy

    try:
        info = os.stat(path)
    except OSError:  # absent or unreadable: read_json's sentence
        return read_json(path, what, expect=expect, hint=hint)
    key = (os.path.realpath(path), info.st_dev, info.st_ino, info.st_size, info.st_mtime_ns)
    if key not in _READ_ONCE:
        _READ_ONCE[key] = read_json(path, what, hint=hint)
    value = copy.deepcopy(_READ_ONCE[key])
    problem = _check_type(value, expect)
    if problem:
        return parse_json(json.dumps(value), f"{what} at {path}", expect=expect, hint=hint)  # read_json's sentence
    return value


# ---- what sinkscope wrote: the inventory -------------------------------------------------------------

#: the hidden file in which a writer lists what it wrote into a folder (written last).
INVENTORY = ".sinkscope-files"
INVENTORY_FORMAT = 1
#: hidden names sinkscope gives its own temporaries beside or inside a folder it writes: the lock,
#: the accumulator checkpoint for --resume, staging folders, a folder moved aside during a swap,
#: atomic-write temporaries.
_TEMPORARY = re.compile(r"^\..+\.(lock|progress\.safetensors|progress\.pt|partial-[A-Za-z0-9_]+|old-\d+|"
                        r"replacing-\d+|report-[A-Za-z0-9_]+|[A-Za-z0-9_]+\.tmp)$")


def is_temporary_name(name: str) -> bool:
    """Whether ``name`` is one sinkscope gives its temporaries (lock, progress, staging, swap)."""
    return bool(_TEMPORARY.match(name))


def _walk_files(folder: Path, prefix: str = "") -> Iterator[tuple[str, os.DirEntry]]:
    """(relative path, entry) of every entry under ``folder``, not following symbolic links.

    A folder holding its own inventory is yielded as one entry and not entered (it is another
    writer's), and so is a sinkscope temporary (a killed run's staging folder). Other directories
    are entered, not yielded.
    """
    with os.scandir(folder) as entries:
        for entry in sorted(entries, key=lambda e: e.name):
            rel = f"{prefix}{entry.name}"
            if entry.is_dir(follow_symlinks=False) and not is_temporary_name(entry.name) \
                    and not os.path.isfile(os.path.join(entry.path, INVENTORY)):
                yield from _walk_files(Path(entry.path), rel + "/")
            else:
                yield rel, entry


def write_inventory(folder: Path, writer: str, *, trees: Iterable[str] = (), keep: Iterable[str] = ()) -> None:
    """Record every file now under ``folder`` as written by ``writer`` (atomically; call it last).

    Call it only on a folder whose every file this writer (or an earlier sinkscope writer, listed
    in ``keep``) wrote: a staging folder, or one checked with :func:`foreign_entries`. Subfolders
    with an inventory of their own (a sweep's checkpoints) are theirs, not listed here.

    Args:
        folder: the folder written.
        writer: what wrote it: ``run``, ``checkpoint``, ``report``, ``sweep``, ``toy``, ``comparison``.
        trees: subfolders whose whole content this writer owns however it changes (a sweep's
            ``submitit/`` logs).
        keep: files recorded by an earlier inventory of this folder that stay recorded.
    """
    folder = Path(folder)
    files = sorted({rel for rel, entry in _walk_files(folder)
                    if rel != INVENTORY and not is_temporary_name(entry.name)
                    and not entry.is_symlink() and entry.is_file(follow_symlinks=False)} | set(keep))
    record = {"sinkscope_files": INVENTORY_FORMAT, "writer": writer, "files": files, "trees": sorted(set(trees))}
    atomic_write_text(folder / INVENTORY, json.dumps(record, indent=1) + "\n")


def read_inventory(folder: Path) -> dict | None:
    """A folder's inventory (``writer``, ``files``, ``trees``), or None when it has none.

    A damaged one (not UTF-8, not JSON, nested too deeply, no list of files) is one sentence naming
    it: sinkscope cannot tell which of the folder's files it wrote, so it replaces none of them.
    """
    path = Path(folder) / INVENTORY
    if not path.is_file():
        return None
    hint = ("sinkscope cannot tell which files of the folder it wrote, so it replaces none of them: remove the "
            "folder yourself if nothing in it is yours, or write elsewhere")
    record = read_json(path, "sinkscope's record of its files", expect=dict, hint=hint)
    if not isinstance(record.get("files"), list):
        raise SinkscopeError(f"sinkscope's record of its files at {path} holds no list of files; {hint}.")
    return {"writer": str(record.get("writer", "")), "files": [str(f) for f in record["files"]],
            "trees": [str(t) for t in record.get("trees", []) if isinstance(t, str)]}


def foreign_entries(folder: Path, legacy: Callable[[str], bool] | None = None) -> list[str]:
    """What ``folder`` holds that sinkscope did not write, as relative paths (folders end in ``/``).

    An entry is sinkscope's when the folder's inventory lists it, it lies in a tree the inventory
    owns, it is one of sinkscope's temporaries, or it is a subfolder that is itself sinkscope's
    (its own inventory, checked the same way). A folder without an inventory, written by a
    sinkscope before inventories, is recognised by ``legacy(relative path)`` (the fixed names its
    writer used), when given. A symbolic link is never sinkscope's.
    """
    folder = Path(folder)
    if not folder.is_dir():
        return []
    inventory = read_inventory(folder)
    listed = set(inventory["files"]) if inventory else set()
    trees = tuple(t.rstrip("/") + "/" for t in inventory["trees"]) if inventory else ()
    foreign: list[str] = []
    for rel, entry in _walk_files(folder):
        if entry.is_symlink():
            foreign.append(rel)
        elif is_temporary_name(entry.name):
            continue
        elif entry.is_dir(follow_symlinks=False):  # another writer's folder: its own inventory decides
            foreign += [f"{rel}/{inner}" for inner in foreign_entries(Path(entry.path))]
        elif rel == INVENTORY and inventory is not None:
            continue
        elif not (rel in listed or rel.startswith(trees) or is_temporary_name(entry.name)
                  or (inventory is None and legacy is not None and legacy(rel))):
            foreign.append(rel)
    return foreign


def is_ours(folder: Path, legacy: Callable[[str], bool] | None = None) -> bool:
    """Whether ``folder`` exists and holds only what sinkscope wrote (:func:`foreign_entries`)."""
    folder = Path(folder)
    return folder.is_dir() and (read_inventory(folder) is not None or legacy is not None) \
        and not foreign_entries(folder, legacy)


def describe_entries(entries: list[str], limit: int = 3) -> str:
    """``notes.txt, mymodel/config.json and 4 more`` for a message."""
    shown = ", ".join(entries[:limit])
    return shown + (f" and {len(entries) - limit} more" if len(entries) > limit else "")


def check_replaceable(folder: Path, overwrite: bool, *, kind: str, legacy: Callable[[str], bool] | None = None,
                      hint: str = f"pass {option('overwrite', True)}", flag: str = option("out")) -> None:
    """Refuse an output ``folder`` that holds something, unless ``overwrite`` and all of it is sinkscope's.

    ``--overwrite`` replaces an empty folder or one that holds only what sinkscope wrote
    (:func:`foreign_entries`), never a folder holding anything else: that could be the model being
    measured or a user's files.

    Args:
        folder: the output folder (need not exist).
        overwrite: whether the user asked to replace it.
        kind: what the folder is, for the messages ("run", "trainer checkpoint", "report").
        legacy: recognises the files of such a folder written before inventories existed.
        hint: what to do when it exists and ``overwrite`` is off.
        flag: the option that named the folder, for the messages.
    """
    folder = Path(folder)
    if folder.is_symlink() or (folder.exists() and not folder.is_dir()):
        raise SinkscopeError(f"{folder} exists and is not a folder; choose another {flag}.")
    if not folder.is_dir() or all(is_temporary_name(entry.name) for entry in folder.iterdir()):
        return  # absent, empty, or only sinkscope's temporaries (a lock, a staging folder)
    foreign = foreign_entries(folder, legacy)
    if foreign or (read_inventory(folder) is None and legacy is None):
        what = describe_entries(foreign) if foreign else "no record of what wrote it"
        raise SinkscopeError(f"the folder {folder} holds files sinkscope did not write ({what}); sinkscope never "
                             f"replaces them, with or without {option('overwrite', True)}: choose another {flag}, or move them.")
    if not overwrite:
        raise SinkscopeError(f"the {kind} folder {folder} already exists; {hint}, or choose another {flag}.")


def check_not_cwd(folder: Path, what: str = "a run needs", example: str = "runs/NAME") -> None:
    """A writer replaces its folder in one rename: never the current folder or one above it.

    ``what`` and ``example`` finish the sentence: "--out . is the current folder or one above it;
    {what} a folder of its own, e.g. --out {example}."
    """
    target = Path(os.path.abspath(folder))
    here = Path.cwd()
    if target == here or target in here.parents:
        raise SinkscopeError(f"{option('out')} {folder} is the current folder or one above it; {what} a folder of its own, "
                             f"e.g. {option('out')} {example}.")


def check_inputs_outside(folder: Path, inputs: dict[str, str | os.PathLike | None], flag: str = option("out")) -> None:
    """Refuse an output ``folder`` that holds (or is) a file or folder the command reads, or lies inside one.

    A writer replaces its folder whole, so the model being measured, a text file, a tokenizer or
    a recipe inside it would be deleted; and a run folder inside a model's folder would change the
    model's folder (a checkpoint with a foreign subfolder can no longer be resumed). ``inputs`` maps a description ("the model") to a path
    (None or a hub id that is not a path on disk are skipped).
    """
    target = Path(os.path.realpath(folder))
    for what, path in inputs.items():
        if path is None or not os.path.exists(path):
            continue
        source = Path(os.path.realpath(path))
        if source == target or target in source.parents:
            raise SinkscopeError(f"{what} {path} lies inside {flag} {folder}, which this command replaces; "
                                 f"choose another {flag}.")
        if source in target.parents:  # writing into the model's (or tokenizer's) own folder changes it
            raise SinkscopeError(f"{flag} {folder} lies inside {what} {path}; sinkscope writes nothing into a "
                                 f"folder it reads: choose another {flag}.")


def lock_path(folder: Path) -> Path:
    """The lock file of an output folder: ``.NAME.lock`` beside it (every writer's)."""
    folder = Path(os.path.abspath(folder))
    return folder.parent / f".{folder.name}.lock"


@contextmanager
def lock_folder(folder: Path, kind: str = "output", flag: str = option("out"), writer: str | None = None) -> Iterator[None]:
    """Hold ``folder``'s lock (:func:`lock_path`) for the block: one writer per folder, whatever writes it.

    A second writer (a run, a training, a report, a sweep, the toy task) fails at once with one
    sentence, and so does a place that cannot be written (a file on the way, no permission), before
    any work. The lock file is removed at the end; a killed writer leaves no live lock.

    Args:
        folder: the output folder (need not exist; its parent is created).
        kind: what the folder is, for the messages ("run", "checkpoint", "report").
        flag: the option that named it.
        writer: what writes it, for the message naming the other holder ("run", "training"; default ``kind``).
    """
    path = lock_path(folder)
    for parent in [path.parent, *path.parent.parents]:  # mkdir would say "File exists" for a file on the way
        if parent.exists() and not parent.is_dir():
            raise SinkscopeError(f"could not write the {kind} folder {folder}: {parent} is a file, not a folder; "
                                 f"choose another {flag}.")
    with ExitStack() as stack:
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            stack.enter_context(exclusive_lock(path, lambda owner: (
                f"another sinkscope {writer or kind} (process {owner}) is writing {folder} right now; wait for it "
                f"to finish or choose another {flag}.")))
        except OSError as error:
            where = f": {error.filename}" if error.filename else ""
            raise SinkscopeError(f"could not write the {kind} folder {folder} ({error.strerror or error}{where}); "
                                 f"choose another {flag}.") from error
        yield


@contextmanager
def exclusive_lock(path: Path, busy: Callable[[str], str]) -> Iterator[None]:
    """Hold an exclusive lock file at ``path`` for the ``with`` block; a second holder fails at once.

    The lock file is created with ``O_CREAT | O_EXCL | O_NOFOLLOW`` and then ``flock``-ed (the
    kernel releases the flock if the process dies, so a kill leaves no live lock); it holds the
    owner's process id and is removed on release. A lock file left by a killed process is
    recognised (not locked, one link, a process id and nothing else) and replaced; anything else
    at ``path`` (a symbolic link, a file with other content or other links) is never opened for
    writing, truncated or removed: one sentence instead. ``busy(owner)`` gives the sentence of the
    :class:`SinkscopeError` raised when another process (or another ``with`` block) holds it.
    """
    import fcntl

    path = Path(path)
    nofollow = getattr(os, "O_NOFOLLOW", 0)
    for _ in range(100):
        try:
            fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL | nofollow, 0o666)
        except FileExistsError:
            _clear_stale_lock(path, busy)
            continue
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:  # another process created it between our unlink and our open
            os.close(fd)
            continue
        except BaseException:
            os.close(fd)
            raise
        try:  # the file may have been removed (by its previous holder) between our open and our flock
            same = os.fstat(fd).st_ino == os.stat(path, follow_symlinks=False).st_ino
        except FileNotFoundError:
            same = False
        if same:
            break
        os.close(fd)
    else:  # pragma: no cover - a hundred races in a row
        raise SinkscopeError(busy("unknown"))
    try:
        os.write(fd, f"{os.getpid()}\n".encode("ascii"))
        yield
    finally:
        try:
            path.unlink(missing_ok=True)  # while still locked, so no one locks a removed file for long
        finally:
            os.close(fd)


_PID_LINE = re.compile(rb"^\d*\n?$")


def _clear_stale_lock(path: Path, busy: Callable[[str], str]) -> None:
    """Remove a lock file a killed process left at ``path``; raise ``busy`` if a process holds it.

    Only a regular file with one link holding at most a process id is removed (after checking
    that no process holds its flock); anything else is refused in one sentence.
    """
    import fcntl
    import stat

    try:
        info = os.stat(path, follow_symlinks=False)
    except FileNotFoundError:
        return
    if not stat.S_ISREG(info.st_mode) or info.st_nlink != 1 or info.st_size > 32:
        raise SinkscopeError(f"{path} is not a sinkscope lock file (it is a link, or holds something else); "
                             f"sinkscope leaves it alone: remove it yourself, or choose another {option('out')}.")
    try:
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0))
    except FileNotFoundError:
        return
    try:
        content = os.read(fd, 64)
        if not _PID_LINE.match(content):
            raise SinkscopeError(f"{path} is not a sinkscope lock file (it holds something else); sinkscope leaves "
                                 f"it alone: remove it yourself, or choose another {option('out')}.")
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise SinkscopeError(busy(content.decode("ascii").strip() or "unknown")) from None
        if os.fstat(fd).st_ino == os.stat(path, follow_symlinks=False).st_ino:
            path.unlink(missing_ok=True)  # a dead process's lock: ours to remove, while we hold its flock
    except FileNotFoundError:
        return
    finally:
        os.close(fd)


def expand_paths(options, **fields: str) -> None:
    """``~`` in the named path fields expanded once, where the options are made (``paths.user_path``),
    so every reader and writer sees the same path; a name that is not UTF-8 is one sentence."""
    for name, flag in fields.items():
        value = getattr(options, name, None)
        if isinstance(value, (str, os.PathLike)):
            object.__setattr__(options, name, user_path(value, flag))
