"""Trainer checkpoints: one folder, replaced whole, never half-written.

A checkpoint folder holds

    config.json        {"sinkscope_trainer": 1, "model": GPTConfig fields, "variant", "tier",
                        "seed", "step", "tokens_seen", "train_options", "data", "versions"}
    model.safetensors  the weights; tied tensors stored once (the LM head is the token
                       embedding) and re-tied on load, the aliases listed in the file's metadata
    tokenizer files    ``save_pretrained`` layout (tokenizer.json, tokenizer_config.json, ...)
    optimizer.pt       AdamW state, data-loader state, RNG states and the step: what ``--resume``
                       needs to continue to the same result as an uninterrupted run
    log.csv            the training log, written by the loop and carried across rewrites
    validation.txt     synthetic tasks only: the task's validation windows as text, one per line
                       (``tasks.TriggerTask.extra_files``)

    .sinkscope-files   the files above, as written (``fileio.write_inventory``, writer
                       ``checkpoint``); a folder holding only log.csv (a run stopped before its
                       first checkpoint) has one too

``save_checkpoint`` writes everything into a hidden sibling folder and then renames it over the
old one, so a reader (or a crash) sees the previous checkpoint or the new one. The swap is two
renames; a crash between them leaves the previous checkpoint as ``.<name>.old-<pid>`` beside it
(a failed swap puts it back; after a kill, ``train --resume`` does, :func:`restore_interrupted_save`,
and a command that finds no checkpoint says how, :func:`interrupted_save_message`). The stage is
``.<name>.partial-<pid>_XXXXXXXX``; what killed saves left beside a complete checkpoint, and
recorded in its inventory, is removed by the next save or ``--resume`` (:func:`clean_leftovers`).
A checkpoint folder is replaced only while it holds nothing but what sinkscope wrote
(:func:`foreign_files`): a user's file in it stops the writer with one sentence instead of being
deleted. A checkpoint written before inventories is recognised by its fixed
file names (:func:`checkpoint_legacy`).
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import tempfile
from dataclasses import asdict
from pathlib import Path

from typing import TYPE_CHECKING

from sinkscope.models.checkpoint_folder import (CARRIED_FILES, TRAINER_FORMAT, WRITER, _is, _kind, clean_leftovers,
                                                foreign_files, model_config, read_config)
from sinkscope.errors import SinkscopeError, option
from sinkscope.store.files import replace_folder, write_inventory

if TYPE_CHECKING:  # torch is imported by the functions that need it: is_checkpoint stays light
    import torch
    from torch import nn

_TIED_KEY = "sinkscope_tied"


def _dedup_state(model: nn.Module) -> tuple[dict[str, torch.Tensor], dict[str, str]]:
    """The state dict with each shared tensor kept once, and {alias: kept name}."""
    tensors: dict[str, torch.Tensor] = {}
    aliases: dict[str, str] = {}
    seen: dict[tuple, str] = {}
    for name, tensor in model.state_dict().items():
        key = (tensor.device, tensor.untyped_storage().data_ptr(), tensor.storage_offset(),
               tuple(tensor.shape), tuple(tensor.stride()), tensor.dtype)
        if tensor.numel() and key in seen:
            aliases[name] = seen[key]
            continue
        seen[key] = name
        tensors[name] = tensor.detach().to("cpu").contiguous()
    return tensors, aliases


def _fsync_tree(folder: Path) -> None:
    """Flush every file to disk and give it ordinary permissions (some writers create 0600)."""
    mode = 0o666 & ~_umask()
    for path in folder.iterdir():
        if path.is_file():
            os.chmod(path, mode)
            with open(path, "rb") as handle:
                os.fsync(handle.fileno())


class CheckpointWriteError(SinkscopeError):
    """A checkpoint could not be written (a full disk, a failing writer); the folder is as it was.

    Attributes:
        step: the step whose checkpoint was being written.
        reason: what failed, in a few words (``No space left on device``).
    """

    def __init__(self, folder: Path, step: int, reason: str):
        self.step, self.reason = int(step), reason
        super().__init__(f"could not write the checkpoint of step {step} into {folder} ({reason}); the folder is "
                         "unchanged.")


def _write_failure(error: BaseException) -> str | None:
    """What a writer's failure says, when it is one a full disk or a failing writer raises (else None).

    An OSError (ENOSPC, EIO, ...), torch.save's RuntimeError, a safetensors error, or the bare
    ``Exception`` the tokenizers library raises for its I/O errors.
    """
    from safetensors import SafetensorError

    if isinstance(error, OSError):
        return error.strerror or str(error) or type(error).__name__
    if isinstance(error, (RuntimeError, SafetensorError)) or type(error) is Exception:
        text = (str(error).strip().splitlines() or [type(error).__name__])[0]
        return text[:200]
    return None


def save_checkpoint(folder: str | os.PathLike, model: nn.Module, optimizer: torch.optim.Optimizer | None,
                    step: int, train_state: dict | None, tokenizer, meta: dict,
                    extra_files: dict[str, bytes] | None = None, *,
                    carry_from: str | os.PathLike | None = None) -> Path:
    """Write a checkpoint of ``model`` (the bare module, not a DDP wrapper) into ``folder``.

    The new folder is complete before it replaces the old one; a write that fails (a full disk)
    raises :class:`CheckpointWriteError` and leaves ``folder`` as it was. A ``folder`` holding
    files sinkscope did not write (:func:`foreign_files`) is never replaced: one sentence instead.

    Args:
        meta: config.json fields besides the model's (tier, seed, tokens_seen, train_options,
            data, ...); ``step``, ``variant``, ``model`` and ``versions`` are filled in here.
        train_state: data-loader state, RNG states, counters; saved in optimizer.pt.
        extra_files: {file name: contents} written into the folder too (a task's files).
        carry_from: the folder whose ``CARRIED_FILES`` (log.csv) the checkpoint takes; default
            ``folder`` (a replacement trained beside it gives its own).
    """
    import torch
    from safetensors.torch import save_file

    from sinkscope.store.results import versions

    folder = Path(folder)
    carry_from = folder if carry_from is None else Path(carry_from)
    folder.parent.mkdir(parents=True, exist_ok=True)
    try:
        stage = Path(tempfile.mkdtemp(prefix=f".{folder.name}.partial-{os.getpid()}_", dir=folder.parent))
    except OSError as error:
        raise CheckpointWriteError(folder, step, _write_failure(error)) from error
    old = folder.parent / f".{folder.name}.old-{os.getpid()}"  # where replace_folder moves the old one aside
    try:
        config = model.config
        config_json = {
            "sinkscope_trainer": TRAINER_FORMAT,
            "model": asdict(config),
            "variant": config.variant,
            **{k: v for k, v in meta.items() if k not in ("model", "variant", "step")},
            "step": int(step),
            "versions": versions(),
        }
        try:
            tensors, aliases = _dedup_state(model)
            save_file(tensors, str(stage / "model.safetensors"),
                      metadata={"format": "pt", _TIED_KEY: json.dumps(aliases, sort_keys=True)})
            tokenizer.save_pretrained(str(stage))
            if optimizer is not None:
                torch.save({"step": int(step), "optimizer": optimizer.state_dict(), "train_state": train_state or {}},
                           stage / "optimizer.pt")
            for name, contents in (extra_files or {}).items():
                (stage / name).write_bytes(contents)
            for name in CARRIED_FILES:
                if (carry_from / name).is_file():
                    shutil.copy2(carry_from / name, stage / name)
            # config.json, then the inventory: a stage that has config.json is complete (is_checkpoint).
            (stage / "config.json").write_text(json.dumps(config_json, indent=2) + "\n", encoding="utf-8")
            write_inventory(stage, WRITER)
            _fsync_tree(stage)
            os.chmod(stage, 0o777 & ~_umask())
        except Exception as error:  # noqa: BLE001 - _write_failure picks the writers' failures, the rest propagate
            reason = _write_failure(error)
            if reason is None:
                raise
            raise CheckpointWriteError(folder, step, reason) from error
        foreign = foreign_files(folder)
        if foreign:  # a user's file appeared in the folder while the model trained: never deleted
            from sinkscope.store.files import describe_entries

            raise SinkscopeError(f"could not write the checkpoint of step {step}: {folder} now holds files that are "
                                 f"not part of the checkpoint ({describe_entries(foreign)}), and replacing the folder "
                                 f"would delete them; move them out (the folder is unchanged) and continue with {option('resume', True)}.")
        try:
            replace_folder(stage, folder)
        except OSError as error:
            raise CheckpointWriteError(folder, step, _write_failure(error)) from error
    except BaseException:
        shutil.rmtree(stage, ignore_errors=True)
        if old.is_dir():  # the swap stopped between its renames: the old folder goes back (or away, if replaced)
            if not folder.exists():
                with contextlib.suppress(OSError):
                    os.replace(old, folder)
            else:
                shutil.rmtree(old, ignore_errors=True)
        raise
    clean_leftovers(folder)  # what killed saves left beside it (only what they recorded, and never a live writer's)
    return folder


def _umask() -> int:
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def load_checkpoint(folder: str | os.PathLike, *, for_training: bool = False, map_location: str = "cpu"):
    """``(model, tokenizer, meta, optimizer_state)`` from a checkpoint folder.

    ``meta`` is config.json. ``optimizer_state`` is optimizer.pt's dict (``optimizer``,
    ``train_state``, ``step``) when ``for_training``, else None. The model is in eval mode on
    ``map_location``, with tied weights re-tied. Missing or damaged files give a one-sentence
    :class:`SinkscopeError`.
    """
    from safetensors import safe_open
    import torch
    from safetensors.torch import load_file

    from sinkscope.train.data import load_tokenizer_folder
    from sinkscope.train.model import GPT

    folder = Path(folder)
    meta = read_config(folder)
    config = model_config(meta, folder)

    weights = folder / "model.safetensors"
    if not weights.is_file():
        raise SinkscopeError(f"the checkpoint in {folder} has no model.safetensors.")
    check_weights_fit_config(folder, config)  # before anything of the config's size is allocated
    try:
        state = load_file(str(weights), device="cpu")
        with safe_open(str(weights), framework="pt") as handle:
            tied = (handle.metadata() or {}).get(_TIED_KEY, "{}")
    except Exception as error:  # noqa: BLE001 - safetensors raises its own error types
        raise SinkscopeError(f"the checkpoint's model.safetensors in {folder} is damaged or incomplete ({error}).") from error
    from sinkscope.store.files import parse_json

    aliases = parse_json(tied, f"the tied-weights record of the checkpoint's model.safetensors in {folder}",
                         expect=dict, hint="it is damaged: restore it from a copy, or train the model again")
    for alias, kept in aliases.items():
        if isinstance(kept, str) and kept in state:
            state[alias] = state[kept]
    try:
        with torch.random.fork_rng(devices=[]):  # building the model must not move the caller's RNG
            model = GPT(config)
    except (TypeError, ValueError, RuntimeError) as error:
        raise SinkscopeError(f"the model settings in {folder}/config.json are not valid "
                             f"({str(error).splitlines()[0][:200]}).") from error
    try:
        model.load_state_dict(state, strict=True)
    except RuntimeError as error:
        raise SinkscopeError(
            f"the weights in {folder} do not fit the model its config.json describes ({str(error).splitlines()[0][:200]})."
        ) from error
    model.to(map_location).eval()

    if not (folder / "tokenizer.json").is_file() and not (folder / "tokenizer_config.json").is_file():
        raise SinkscopeError(f"the checkpoint in {folder} has no tokenizer files.")
    tokenizer = load_tokenizer_folder(folder, f"of the checkpoint in {folder}")

    optimizer_state = None
    if for_training:
        path = folder / "optimizer.pt"
        if not path.is_file():
            raise SinkscopeError(f"the checkpoint in {folder} has no optimizer.pt, so it cannot be resumed.")
        try:  # weights_only: tensors and plain containers only, never code (a pickle needing more is refused)
            optimizer_state = torch.load(path, map_location="cpu", weights_only=True)
        except Exception as error:  # noqa: BLE001
            reason = (str(error).strip().splitlines() or [type(error).__name__])[0][:200]
            raise SinkscopeError(f"the checkpoint's optimizer.pt in {folder} is damaged or incomplete ({reason}).") from error
        problem = _optimizer_state_problem(optimizer_state, meta)
        if problem:
            raise SinkscopeError(f"the checkpoint's optimizer.pt in {folder} is damaged or incomplete ({problem}), "
                                 "so it cannot be resumed.")
    return model, tokenizer, meta, optimizer_state


#: which config field sets the leading dimensions of a trainer tensor, by the tensor's name (the rest: the width).
_FIELD_OF_TENSOR = (("transformer.wte.", "vocab_size"), ("lm_head.", "vocab_size"), ("transformer.wpe.", "block_size"),
                    ("transformer.h.", "n_layer"))


def _saved_shapes(weights: Path) -> dict[str, tuple[int, ...]]:
    """Every tensor's shape in a trainer's safetensors file, from its header alone (no tensor is
    read); a tied alias (the file's metadata) has the shape of the tensor it stands for."""
    from safetensors import safe_open

    try:
        with safe_open(str(weights), framework="pt") as handle:
            shapes = {name: tuple(handle.get_slice(name).get_shape()) for name in handle.keys()}
            tied = (handle.metadata() or {}).get(_TIED_KEY, "{}")
        aliases = json.loads(tied)
        if isinstance(aliases, dict):
            shapes.update({alias: shapes[kept] for alias, kept in aliases.items()
                           if isinstance(alias, str) and isinstance(kept, str) and kept in shapes})
        return shapes
    except ValueError:  # the tied record is not JSON: load_checkpoint names it
        return shapes
    except Exception as error:  # noqa: BLE001 - safetensors raises its own error types
        raise SinkscopeError(f"the checkpoint's model.safetensors in {weights.parent} is damaged or incomplete "
                             f"({str(error).splitlines()[0][:200] if str(error) else type(error).__name__}).") from error


def check_weights_fit_config(folder: str | os.PathLike, config) -> int:
    """Refuse, before allocating, a checkpoint whose config.json describes other tensors than its weights hold.

    A 5 MB checkpoint whose config.json says ``block_size = 10**7`` would otherwise build a
    (10**7, C) position table (5 GB at C = 128) before ``load_state_dict`` noticed (issue 60). The
    model is built on the meta device (no memory), its every tensor's shape compared with the
    shapes in model.safetensors' header; the first that differs is named with the config field that
    sets it. Returns the model's bytes in float32 (what building it allocates), also checked against
    the memory available. ``config`` is the checkpoint's ``GPTConfig``.
    """
    import torch

    from sinkscope.models.size import _human
    from sinkscope.runtime.memory import available_memory
    from sinkscope.train.model import GPT

    folder = Path(folder)
    saved = _saved_shapes(folder / "model.safetensors")
    try:
        with torch.device("meta"), torch.random.fork_rng(devices=[]):
            skeleton = GPT(config)
    except (TypeError, ValueError, RuntimeError) as error:
        raise SinkscopeError(f"the model settings in {folder}/config.json are not valid "
                             f"({str(error).splitlines()[0][:200]}).") from error
    expected = {name: tuple(tensor.shape) for name, tensor in skeleton.state_dict().items()}
    for name, shape in expected.items():
        held = saved.get(name)
        if held != shape:
            field = next((field for prefix, field in _FIELD_OF_TENSOR if name.startswith(prefix)), "n_embd")
            value = getattr(config, field, None)
            what = "does not hold it" if held is None else f"holds {held}"
            raise SinkscopeError(
                f"the checkpoint in {folder} does not match its config.json ({field} = {value:,} asks for {name} of "
                f"shape {shape}, but model.safetensors {what}); the folder is damaged or was edited, so sinkscope "
                "refuses it before allocating anything." if isinstance(value, int) else
                f"the checkpoint in {folder} does not match its config.json (it asks for {name} of shape {shape}, "
                f"but model.safetensors {what}); the folder is damaged or was edited.")
    need = sum(tensor.numel() * 4 for tensor in skeleton.parameters())  # float32 weights
    memory = available_memory()
    if memory is not None and need > memory:
        raise SinkscopeError(f"the checkpoint in {folder} needs {_human(need)} to load, against {_human(memory)} of "
                             "memory available.")
    return need


def _optimizer_state_problem(state, meta: dict) -> str | None:
    """What is wrong with optimizer.pt's contents for ``--resume`` (None if nothing)."""
    if not isinstance(state, dict):
        return f"it holds {_kind(state)}, not the trainer's state"
    if not isinstance(state.get("optimizer"), dict) or not isinstance(state.get("train_state", {}), dict):
        return "it lacks the optimizer state"
    if not _is(state.get("step"), (int,)):
        return "it has no step"
    if state["step"] != meta.get("step"):
        return f"it is of step {state['step']} and config.json of step {meta.get('step')}"
    if not isinstance(state.get("train_state", {}).get("batches"), dict):
        return "it lacks the batch order"
    return None
