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

``save_checkpoint`` writes everything into a hidden sibling folder and then renames it over the
old one, so a reader (or a crash) sees the previous checkpoint or the new one. The swap is two
renames; a crash between them leaves the previous checkpoint as ``.<name>.old-<pid>`` beside it.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from dataclasses import asdict
from pathlib import Path

from typing import TYPE_CHECKING

from sinkscope.errors import SinkscopeError
from sinkscope.fileio import replace_folder

if TYPE_CHECKING:  # torch is imported by the functions that need it: is_checkpoint stays light
    import torch
    from torch import nn

#: config.json's marker and format version.
TRAINER_FORMAT = 1
#: files the loop owns that survive a checkpoint rewrite.
CARRIED_FILES = ("log.csv",)
_TIED_KEY = "sinkscope_tied"


def is_checkpoint(folder: str | os.PathLike) -> bool:
    """Whether ``folder`` holds a trainer checkpoint (its config.json has ``sinkscope_trainer``)."""
    path = Path(folder) / "config.json"
    try:
        return "sinkscope_trainer" in json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError, TypeError):
        return False


def read_config(folder: str | os.PathLike) -> dict:
    """A checkpoint's config.json, or a one-sentence error."""
    path = Path(folder) / "config.json"
    if not path.is_file():
        raise SinkscopeError(f"there is no trainer checkpoint in {folder} (no config.json).")
    try:
        meta = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as error:
        raise SinkscopeError(f"the checkpoint's config.json in {folder} is damaged ({error}).") from error
    if not isinstance(meta, dict) or "sinkscope_trainer" not in meta:
        raise SinkscopeError(f"{folder} is not a sinkscope trainer checkpoint (config.json lacks sinkscope_trainer).")
    if meta["sinkscope_trainer"] > TRAINER_FORMAT:
        raise SinkscopeError(
            f"the checkpoint in {folder} has trainer format {meta['sinkscope_trainer']}, newer than this "
            f"sinkscope reads ({TRAINER_FORMAT}); upgrade sinkscope."
        )
    return meta


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


def save_checkpoint(folder: str | os.PathLike, model: nn.Module, optimizer: torch.optim.Optimizer | None,
                    step: int, train_state: dict | None, tokenizer, meta: dict,
                    extra_files: dict[str, bytes] | None = None) -> Path:
    """Write a checkpoint of ``model`` (the bare module, not a DDP wrapper) into ``folder``.

    Args:
        meta: config.json fields besides the model's (tier, seed, tokens_seen, train_options,
            data, ...); ``step``, ``variant``, ``model`` and ``versions`` are filled in here.
        train_state: data-loader state, RNG states, counters; saved in optimizer.pt.
        extra_files: {file name: contents} written into the folder too (a task's files).
    """
    import torch
    from safetensors.torch import save_file

    from sinkscope.results import versions

    folder = Path(folder)
    folder.parent.mkdir(parents=True, exist_ok=True)
    stage = Path(tempfile.mkdtemp(prefix=f".{folder.name}.partial-", dir=folder.parent))
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
            if (folder / name).is_file():
                shutil.copy2(folder / name, stage / name)
        # config.json last: a stage that has it is complete (is_checkpoint checks for it).
        (stage / "config.json").write_text(json.dumps(config_json, indent=2) + "\n", encoding="utf-8")
        _fsync_tree(stage)
        os.chmod(stage, 0o777 & ~_umask())
        replace_folder(stage, folder)
    except BaseException:
        shutil.rmtree(stage, ignore_errors=True)
        raise
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
    from sinkscope.train.model import GPT, GPTConfig

    folder = Path(folder)
    meta = read_config(folder)
    try:
        config = GPTConfig(**meta["model"])
    except (KeyError, TypeError, ValueError) as error:
        raise SinkscopeError(f"the model settings in {folder}/config.json are not valid ({error}).") from error

    weights = folder / "model.safetensors"
    if not weights.is_file():
        raise SinkscopeError(f"the checkpoint in {folder} has no model.safetensors.")
    try:
        state = load_file(str(weights), device="cpu")
        with safe_open(str(weights), framework="pt") as handle:
            aliases = json.loads((handle.metadata() or {}).get(_TIED_KEY, "{}"))
    except Exception as error:  # noqa: BLE001 - safetensors raises its own error types
        raise SinkscopeError(f"the checkpoint's model.safetensors in {folder} is damaged or incomplete ({error}).") from error
    for alias, kept in aliases.items():
        if kept in state:
            state[alias] = state[kept]
    with torch.random.fork_rng(devices=[]):  # building the model must not move the caller's RNG
        model = GPT(config)
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
        try:
            optimizer_state = torch.load(path, map_location="cpu", weights_only=True)
        except Exception as error:  # noqa: BLE001
            raise SinkscopeError(f"the checkpoint's optimizer.pt in {folder} is damaged or incomplete ({error}).") from error
    return model, tokenizer, meta, optimizer_state
