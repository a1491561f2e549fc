"""A trainer checkpoint folder on disk, torch-free: recognising one, its files, and the leftovers of an
interrupted save (``train/checkpoint.py`` writes and reads the weights).

The command line resolves a MODEL (``models/resolve.py``) and a report reads a run (``report/``) before
torch loads; both ask here whether a folder is a checkpoint. The swap that replaces a checkpoint
is two renames; a crash between them leaves the previous checkpoint as ``.<name>.old-<pid>``
beside an absent ``<name>`` (:func:`interrupted_save`, :func:`interrupted_save_message`,
:func:`restore_interrupted_save`), and what killed saves left beside a complete checkpoint is
removed by the next save or ``--resume`` (:func:`clean_leftovers`). A checkpoint folder is
replaced only while it holds nothing but what sinkscope wrote (:func:`foreign_files`).
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import re
from pathlib import Path

from sinkscope.errors import SinkscopeError
from sinkscope.models.trainer_config import GPTConfig
from sinkscope.store.files import INVENTORY, foreign_entries, is_temporary_name, read_inventory

#: config.json's marker and format version.
TRAINER_FORMAT = 1
#: files the loop owns that survive a checkpoint rewrite.
CARRIED_FILES = ("log.csv", "monitor.csv", "monitor.json", "monitor_tokens.npy", "monitor_windows.npz")  # all but log.csv: --monitor-every
#: the inventory's writer name for a checkpoint folder.
WRITER = "checkpoint"
#: the fixed names of the files a checkpoint held before inventories existed: the trainer's own
#: and those ``save_pretrained`` writes for the tokenizers the trainer takes.
LEGACY_FILES = frozenset({
    "config.json", "model.safetensors", "optimizer.pt", "log.csv", "validation.txt",
    "tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "added_tokens.json", "vocab.json",
    "merges.txt", "vocab.txt", "tokenizer.model", "spiece.model", "sentencepiece.bpe.model",
    "chat_template.jinja", "chat_template.json",
})


def is_checkpoint(folder: str | os.PathLike) -> bool:
    """Whether ``folder`` holds a trainer checkpoint (its config.json has ``sinkscope_trainer``).

    A damaged one counts (its readers say what is wrong with it, :func:`read_config`).
    """
    from sinkscope.store.files import read_json_once

    try:  # a damaged config.json (not JSON, [[[[...]]]]) is no checkpoint here; resolving the model names it
        meta = read_json_once(Path(folder) / "config.json", "the checkpoint's config.json")
    except (SinkscopeError, TypeError):
        return False
    return isinstance(meta, dict) and "sinkscope_trainer" in meta


def is_legacy_checkpoint_file(rel: str) -> bool:
    """A file of a checkpoint written before inventories (``fileio.foreign_entries``): its fixed names."""
    return rel in LEGACY_FILES


def checkpoint_legacy(folder: str | os.PathLike):
    """``legacy`` for ``fileio.check_replaceable``/``foreign_entries``: a checkpoint's fixed names, when the
    folder is a checkpoint or holds only a log.csv (a run stopped before its first checkpoint); else None."""
    folder = Path(folder)
    if is_checkpoint(folder):
        return is_legacy_checkpoint_file
    try:
        names = {entry.name for entry in os.scandir(folder) if not is_temporary_name(entry.name)}
    except OSError:
        return None
    return is_legacy_checkpoint_file if names == {"log.csv"} else None


def foreign_files(folder: str | os.PathLike) -> list[str]:
    """What the checkpoint folder ``folder`` holds that sinkscope did not write (relative paths).

    ``fileio.foreign_entries`` with the legacy names, less :data:`CARRIED_FILES` (copied into the new
    folder), and every subfolder: a checkpoint has none, so one (even a run folder sinkscope wrote
    there) would be lost when the folder is replaced.
    """
    folder = Path(folder)
    if folder.is_symlink() or not folder.is_dir():
        return []
    # the loop's own files (log.csv, the monitor's) are copied into every new checkpoint (CARRIED_FILES), so
    # replacing the folder loses none of them, whichever step wrote them
    found = [rel for rel in foreign_entries(folder, checkpoint_legacy(folder)) if rel not in CARRIED_FILES]
    with os.scandir(folder) as entries:
        subfolders = [f"{entry.name}/" for entry in entries
                      if entry.is_dir(follow_symlinks=False) and not is_temporary_name(entry.name)]
    return sorted(set(found) | {f for f in subfolders if not any(e.startswith(f) for e in found)})


# ---- what an interrupted save leaves beside the folder -----------------------------------------------


def _leftovers(folder: Path) -> list[tuple[Path, str, int | None]]:
    """The save's leftovers beside ``folder``, as (path, ``old`` or ``partial``, the writer's process id).

    ``.NAME.old-PID`` is the previous checkpoint, moved aside by the swap (``fileio.replace_folder``);
    ``.NAME.partial-PID_XXXXXXXX`` a stage (``.NAME.partial-XXXXXXXX``, without the process id,
    before stages named it). Symbolic links are never leftovers.
    """
    prefix = re.escape(f".{folder.name}.")
    old, partial = re.compile(prefix + r"old-(\d+)"), re.compile(prefix + r"partial-(?:(\d+)_)?[A-Za-z0-9_]+")
    found = []
    try:
        with os.scandir(folder.parent) as entries:
            for entry in entries:
                match = old.fullmatch(entry.name) or partial.fullmatch(entry.name)
                if match and entry.is_dir(follow_symlinks=False):
                    kind = "old" if match.re is old else "partial"
                    found.append((folder.parent / entry.name, kind, int(match.group(1)) if match.group(1) else None))
    except OSError:
        return []
    return sorted(found)


def _own_inventory(folder: Path) -> dict | None:
    """``folder``'s inventory when a checkpoint writer recorded it and it holds nothing else; else None."""
    inventory = read_inventory(folder)
    try:
        if inventory is None or inventory["writer"] != WRITER or folder.is_symlink() or foreign_files(folder):
            return None
    except OSError:  # a folder that cannot be listed is not known to be ours
        return None
    return inventory


def is_complete_checkpoint(folder: str | os.PathLike) -> bool:
    """Whether ``folder`` is a checkpoint holding every file its inventory (``.sinkscope-files``) records."""
    folder = Path(folder)
    inventory = read_inventory(folder)
    return (inventory is not None and inventory["writer"] == WRITER and not folder.is_symlink()
            and is_checkpoint(folder) and "config.json" in inventory["files"]
            and all((folder / rel).is_file() and not (folder / rel).is_symlink() for rel in inventory["files"]))


def interrupted_save(folder: str | os.PathLike) -> Path | None:
    """The checkpoint a save interrupted between its two renames left beside an absent ``folder``.

    The swap moves the checkpoint aside to ``.NAME.old-PID`` and then renames the new one into
    place; a kill between the two leaves no ``folder`` and the previous checkpoint whole beside it.
    Returns that ``.NAME.old-PID`` when it is a complete checkpoint (:func:`is_complete_checkpoint`)
    holding only what sinkscope recorded (the latest written, if several); None when ``folder``
    exists or there is none.
    """
    folder = Path(folder)
    if not folder.name or os.path.lexists(folder):
        return None
    found = [path for path, kind, _ in _leftovers(folder)
             if kind == "old" and is_complete_checkpoint(path) and _own_inventory(path) is not None]
    if not found:
        return None

    def written(path: Path) -> float:
        with contextlib.suppress(OSError):
            return (path / "config.json").stat().st_mtime
        return 0.0

    return max(found, key=lambda path: (written(path), path.name))


def _step_of(folder: Path) -> str:
    """`` of step N`` for a message, from config.json (empty when it has none)."""
    from sinkscope.store.files import read_json

    with contextlib.suppress(SinkscopeError, AttributeError):
        step = read_json(folder / "config.json", "the checkpoint's config.json").get("step")
        if isinstance(step, int) and not isinstance(step, bool):
            return f" of step {step}"
    return ""


def interrupted_save_message(folder: str | os.PathLike, given: str | None = None) -> str | None:
    """One sentence for a command that finds no checkpoint at ``folder`` but :func:`interrupted_save`'s
    copy beside it (None when there is none): it names the copy and how to put it back.

    ``given``: the path as the user wrote it (``~/ck``), when ``folder`` is its expanded form.
    """
    import shlex

    leftover = interrupted_save(folder)
    if leftover is None:
        return None
    given = str(folder) if given is None else given
    leftover = Path(given).parent / leftover.name
    return (f"no checkpoint at {given}, but {leftover} next to it is the checkpoint{_step_of(leftover)} saved before "
            f"a save was interrupted; restore it with `mv {shlex.quote(str(leftover))} {shlex.quote(given)}`, or run "
            f"`sinkscope train --resume --out {shlex.quote(given)}`, which restores it.")


def restore_interrupted_save(folder: str | os.PathLike) -> tuple[Path, str] | None:
    """Put :func:`interrupted_save`'s copy back in place of the absent ``folder`` (one rename).

    Call it holding ``folder``'s lock (``fileio.lock_folder``), so that no other writer creates
    ``folder`` meanwhile. Returns (the copy's former path, `` of step N`` for a message), or None
    when ``folder`` exists or nothing beside it is a complete checkpoint.
    """
    folder = Path(folder)
    leftover = interrupted_save(folder)
    if leftover is None:
        return None
    step = _step_of(leftover)
    try:
        os.rename(leftover, folder)
    except OSError as error:
        raise SinkscopeError(f"could not restore the checkpoint{step} that an interrupted save left at {leftover} "
                             f"({error.strerror or error}); restore it with `mv {leftover} {folder}`.") from error
    return leftover, step


def _alive(pid: int) -> bool:
    """Whether process ``pid`` may be running (this one, and another user's, count as running)."""
    if pid <= 0 or pid == os.getpid():
        return True
    try:
        os.kill(pid, 0)
    except (ProcessLookupError, OverflowError):  # none, or a number no process can have
        return False
    except OSError:  # PermissionError: it exists, another user's
        return True
    return True


def _remove_recorded(folder: Path, files: list[str]) -> None:
    """Remove ``folder``'s recorded files, its temporaries, its inventory and then the folder itself.

    Only those: a file that appeared meanwhile keeps the folder (``rmdir`` fails) and is not deleted.
    """
    for rel in files:
        if rel == os.path.basename(rel) and rel not in ("", ".", "..", INVENTORY):  # a checkpoint is flat
            (folder / rel).unlink(missing_ok=True)
    with os.scandir(folder) as entries:
        temporaries = [entry.name for entry in entries
                       if is_temporary_name(entry.name) and entry.is_file(follow_symlinks=False)]
    for name in temporaries:
        (folder / name).unlink(missing_ok=True)
    (folder / INVENTORY).unlink(missing_ok=True)  # last: a removal cut short leaves a folder still known as ours
    os.rmdir(folder)


def clean_leftovers(folder: str | os.PathLike) -> list[Path]:
    """Remove the stale leftovers of earlier saves beside the checkpoint ``folder``; returns what went.

    Only when ``folder`` is a complete checkpoint (:func:`is_complete_checkpoint`), and only a
    ``.NAME.old-PID`` or ``.NAME.partial-PID_...`` whose process is not running and that holds
    nothing but what a checkpoint writer recorded in it (its ``.sinkscope-files``): those files
    are removed one by one, never a file sinkscope did not write. A stage without an inventory (a
    save killed while writing) or without a process id in its name stays, and so does a leftover
    the file system refuses to remove (this never raises for it).
    """
    folder = Path(folder)
    removed: list[Path] = []
    if not is_complete_checkpoint(folder):
        return removed
    for path, _, pid in _leftovers(folder):
        if pid is None or _alive(pid):
            continue
        try:
            inventory = _own_inventory(path)
            if inventory is not None:
                _remove_recorded(path, inventory["files"])
                removed.append(path)
        except OSError:
            continue
    return removed


# ---- config.json, checked (torch-free: every reader of a checkpoint fails here in one sentence) ----

#: the model settings a checkpoint's config.json must hold (positive integers); the other GPTConfig
#: fields have defaults that older checkpoints rely on.
_SHAPE_FIELDS = ("vocab_size", "block_size", "n_layer", "n_head", "n_embd")
_DATA_TEXT = ("fingerprint", "stream_sha256", "corpus_sha256", "corpus", "tokenizer_fingerprint")
#: config.json's own fields besides ``model``: (allowed JSON types, may be null).
_META_TYPES: dict[str, tuple[tuple[type, ...], bool]] = {
    "step": ((int,), False), "variant": ((str,), False), "tier": ((str,), True), "task": ((str,), True),
    "seed": ((int,), True), "tokens_seen": ((int,), True), "val_loss": ((int, float), True),
    "val_loss_all": ((int, float), True), "val_loss_step": ((int,), True), "load_imbalance": ((int, float), True),
    "train_options": ((dict,), False), "data": ((dict,), False), "rescheduled": ((list,), False),
}

#: the recorded training options a reader uses (``train --resume``, the checkpoint's validation windows).
_OPTION_TYPES: dict[str, tuple[type, ...]] = {
    **{name: (str,) for name in ("variant", "task", "tier", "text_file", "dataset", "tokenizer", "windows")},
    **{name: (int,) for name in ("seed", "steps", "batch_size", "grad_accum", "warmup_steps", "eval_every",
                                 "eval_windows", "checkpoint_every", "log_every", "val_tokens", "force_sink_k")},
    **{name: (int, float) for name in ("lr", "min_lr", "weight_decay", "grad_clip", "lb_lambda")},
    "tnlm": (bool,), "task_options": (list,), "overrides": (list,),
}


def _kind(value) -> str:
    """``a list``, ``the string 'one'``, ... for a message about a value of the wrong type."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return f"the boolean {json.dumps(value)}"
    if isinstance(value, str):
        return f"the string {value[:40]!r}"
    if isinstance(value, (int, float)):
        return f"the number {value!r}"
    return {dict: "a mapping", list: "a list"}.get(type(value), type(value).__name__)


def _is(value, types: tuple[type, ...]) -> bool:
    """isinstance without bool passing for int (JSON's true is not a step number)."""
    return isinstance(value, types) and not (isinstance(value, bool) and bool not in types)


def check_config(meta, folder: str | os.PathLike) -> dict:
    """``meta`` (a checkpoint's config.json) if every field a reader uses has its type; else one sentence.

    The model's shape fields must be positive integers, its settings a valid ``GPTConfig``
    (:func:`model_config`), and the other fields of config.json, its recorded ``train_options`` and
    ``data`` of the types the trainer writes, so that every reader (loading, probe runs,
    ``--resume``, a sweep) fails here in one sentence rather than later.
    """
    def damaged(what: str) -> SinkscopeError:
        return SinkscopeError(f"the checkpoint's config.json in {folder} is damaged ({what}); restore it from a "
                              "copy, or train the model again.")

    if not isinstance(meta, dict) or "sinkscope_trainer" not in meta:
        raise SinkscopeError(f"{folder} is not a sinkscope trainer checkpoint (config.json lacks sinkscope_trainer).")
    version = meta["sinkscope_trainer"]
    if not _is(version, (int,)) or version < 1:
        raise damaged(f"sinkscope_trainer is {_kind(version)}, not a format number")
    if version > TRAINER_FORMAT:
        raise SinkscopeError(
            f"the checkpoint in {folder} has trainer format {version}, newer than this "
            f"sinkscope reads ({TRAINER_FORMAT}); upgrade sinkscope."
        )
    model = meta.get("model")
    if not isinstance(model, dict):
        raise damaged("it has no model settings" if model is None else f"model is {_kind(model)}, not a mapping")
    for name in _SHAPE_FIELDS:
        if name not in model:
            raise damaged(f"the model settings lack {name}")
        if not _is(model[name], (int,)) or model[name] < 1:
            raise damaged(f"the model's {name} is {_kind(model[name])}, not a positive integer")
    if "variant" in model and not isinstance(model["variant"], str):
        raise damaged(f"the model's variant is {_kind(model['variant'])}, not a name")
    for name, (types, nullable) in _META_TYPES.items():
        if name in meta and not (_is(meta[name], types) or (nullable and meta[name] is None)):
            raise damaged(f"{name} is {_kind(meta[name])}")
    if "step" not in meta:
        raise damaged("it has no step")
    if meta["step"] < 0:
        raise damaged(f"step is {meta['step']}")
    for name, value in meta.get("train_options", {}).items():
        types = _OPTION_TYPES.get(name)
        if types is not None and value is not None and not _is(value, types):
            raise damaged(f"the recorded option {name} is {_kind(value)}")
        if types == (list,) and value is not None and not all(isinstance(item, str) for item in value):
            raise damaged(f"the recorded option {name} holds something other than strings")
    for name in _DATA_TEXT:
        value = meta.get("data", {}).get(name)
        if value is not None and not isinstance(value, str):
            raise damaged(f"the data's {name} is {_kind(value)}")
    model_config(meta, folder)  # every model field of its type, and a model GPTConfig accepts
    return meta


def read_config(folder: str | os.PathLike) -> dict:
    """A checkpoint's config.json, checked (:func:`check_config`), or a one-sentence error."""
    path = Path(folder) / "config.json"
    if not path.is_file():
        raise SinkscopeError(f"there is no trainer checkpoint in {folder} (no config.json).")
    from sinkscope.store.files import read_json_once

    meta = read_json_once(path, "the checkpoint's config.json",  # check_config says what a non-object is
                          hint="it is damaged: restore it from a copy, or train the model again")
    return check_config(meta, folder)


def model_config(meta: dict, folder: str | os.PathLike):
    """The ``GPTConfig`` of config.json's ``model`` mapping, or one sentence.

    Every recorded field must be one of GPTConfig's, of its type (a float field takes an integer).
    Imports the model module (and torch) when first called.
    """
    fields = {f.name: f for f in dataclasses.fields(GPTConfig)}
    settings = meta["model"]
    for name, value in settings.items():
        if name not in fields:
            raise SinkscopeError(f"the model settings in {folder}/config.json are not valid (unknown field {name!r}).")
        expected = type(fields[name].default)
        ok = _is(value, (expected,)) or (expected is float and _is(value, (int,)))
        if not ok:
            raise SinkscopeError(f"the model settings in {folder}/config.json are not valid ({name} is "
                                 f"{_kind(value)}, not {'a number' if expected is float else 'an integer' if expected is int else 'a string'}).")
    try:
        return GPTConfig(**settings)
    except (TypeError, ValueError) as error:
        raise SinkscopeError(f"the model settings in {folder}/config.json are not valid ({error}).") from error
