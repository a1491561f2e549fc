"""Tiny random models of every causal-LM type transformers knows, built from the config class alone.

The entry point of the conformance models (other code imports its names from here). For each key
of ``MODEL_FOR_CAUSAL_LM_MAPPING_NAMES``:

* :func:`classify` says what kind of model it is (``CLASSES``), with the reason in ``CLASS_REASONS``
  (``kinds.py``);
* :func:`tiny_config` takes the config class's defaults (``CONFIG_MAPPING[model_type]()``) and
  shrinks every size with one generic rule set (``shrink.py``), then applies the few per-type
  ``OVERRIDES`` where the generic rule is not enough, each saying why (``overrides.py``);
* :func:`build_tiny` builds ``AutoModelForCausalLM.from_config`` of it: float32, eval, eager, seeded;
  :func:`check` builds one type and runs a forward pass (this module).

What sinkscope finds in each model (attention path, learned sink, hook points) is the conformance
matrix's (``matrix.py``, through ``capture.discover``), not repeated here.

``python -m sinkscope.conformance.tiny OUT.json [TYPE ...]`` runs the whole table, one line per
type (built, forward run), and writes a JSON summary. Nothing is downloaded: everything comes from the
installed transformers' config classes.
"""

from __future__ import annotations

import contextlib
import copy
import json
import logging
import sys
import time
import warnings
from typing import Any

import torch

import transformers
from transformers import AutoModelForCausalLM

from sinkscope.conformance.kinds import CLASS_REASONS, CLASSES, classify, model_types
from sinkscope.conformance.overrides import OVERRIDES, tiny_config, tiny_overrides
from sinkscope.conformance.shrink import _is_int

__all__ = [
    "CLASSES",
    "CLASS_REASONS",
    "KNOWN_FAILURES",
    "OVERRIDES",
    "build_tiny",
    "check",
    "classify",
    "main",
    "model_types",
    "tiny_config",
    "tiny_overrides",
]


def _quiet():
    """Silence transformers' warnings for the duration (they are about the random configs)."""
    stack = contextlib.ExitStack()
    stack.enter_context(warnings.catch_warnings())
    warnings.simplefilter("ignore")
    logger = logging.getLogger("transformers")
    level = logger.level
    logger.setLevel(logging.ERROR)
    stack.callback(logger.setLevel, level)
    return stack


def count_parameters_meta(config) -> int:
    """Parameter count of the model ``config`` builds, on the meta device (nothing allocated)."""
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(copy.deepcopy(config), attn_implementation="eager")
    return sum(p.numel() for p in model.parameters())


#: the largest size any parameter of a tiny model may have along one dimension: the shrunk sizes are
#: all below it (vocabulary 128, widths 64-128, positions 256), so a larger one is a size field the
#: shrinker does not know, which would cost gigabytes (a probe's (F, F) accumulators of a 32,768-wide MLP).
MAX_TINY_DIM = 4096


def build_tiny(model_type: str, seed: int = 0):
    """A tiny random float32 eval-mode model of ``model_type`` with eager attention.

    Built on the meta device first: a parameter with a dimension over :data:`MAX_TINY_DIM` is refused
    (ValueError naming it) before anything is allocated.
    """
    config = tiny_config(model_type)
    with torch.device("meta"):
        meta = AutoModelForCausalLM.from_config(copy.deepcopy(config), attn_implementation="eager")
    for name, parameter in meta.named_parameters():
        if max(parameter.shape, default=0) > MAX_TINY_DIM:
            raise ValueError(f"{name} has shape {tuple(parameter.shape)} in the tiny config: a size field the "
                             f"shrinker does not know (over {MAX_TINY_DIM})")
    del meta
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(config, attn_implementation="eager", dtype=torch.float32)
    model = model.float().eval()
    return model


def vocab_of(model) -> int:
    """The text vocabulary size (the range random ids are drawn from, and the logits' last size)."""
    config = model.config.get_text_config(decoder=True)
    vocab = getattr(config, "vocab_size", None)
    if _is_int(vocab):
        return vocab
    return int(model.get_input_embeddings().num_embeddings)


#: why the types that still fail cannot be fixed from the config alone (checked against the modeling files).
KNOWN_FAILURES: dict[str, str] = {
    "gemma3n": "Gemma3nForConditionalGeneration always builds its vision tower as a TimmWrapperModel (MobileNetV5, "
               "vision_config is a TimmWrapperConfig), which imports timm; timm is not installed here and nothing can "
               "be downloaded. The text part alone (gemma3n_text) builds and runs.",
    "gemma4_assistant": "a multi-token-prediction drafter: Gemma4AssistantForCausalLM.forward ignores input_ids and "
                        "raises unless given the target model's inputs_embeds (2 x backbone_hidden_size) and "
                        "shared_kv_states; it does not run from input_ids alone",
    "gemma4_unified_assistant": "same drafter design as gemma4_assistant (needs the target's inputs_embeds and "
                                "shared_kv_states)",
    "musicgen": "MODEL_FOR_CAUSAL_LM maps musicgen to MusicgenForCausalLM, which takes a MusicgenDecoderConfig "
                "(model_type musicgen_decoder), but CONFIG_MAPPING['musicgen'] is the composite MusicgenConfig "
                "(text encoder + audio codec + decoder): from_config fails reading decoder attributes (dropout) off "
                "the composite config",
    "musicgen_melody": "same mapping mismatch as musicgen (MusicgenMelodyForCausalLM needs MusicgenMelodyDecoderConfig)",
}


def _logits(out) -> torch.Tensor:
    return out.logits if hasattr(out, "logits") else out[0]


def check(model_type: str, *, max_params_meta: int = 20_000_000) -> dict[str, Any]:
    """Build one type and run a forward pass of random ids; every failure is caught into the result.

    What sinkscope then finds in the model (its attention path, learned sink, hook points) is the
    conformance matrix's (``matrix.py``), which reads it through ``capture.discover``.
    """
    row: dict[str, Any] = {"type": model_type, "class": classify(model_type), "reason": CLASS_REASONS[model_type]}
    if model_type in KNOWN_FAILURES:
        row["known_failure"] = KNOWN_FAILURES[model_type]
    t0 = time.perf_counter()
    try:
        with _quiet():
            config = tiny_config(model_type)
    except Exception as exc:  # noqa: BLE001
        row.update(build="failed", error=f"config: {type(exc).__name__}: {_short(exc)}")
        return row
    try:
        with _quiet():
            meta = count_parameters_meta(config)
        row["params_meta"] = meta
        if meta > max_params_meta:
            row.update(build="failed", error=f"too big: {meta} parameters on the meta device")
            return row
    except Exception:  # noqa: BLE001
        pass
    try:
        with _quiet():
            model = build_tiny(model_type)
    except Exception as exc:  # noqa: BLE001
        row.update(build="failed", error=f"build: {type(exc).__name__}: {_short(exc)}")
        return row
    row.update(build="ok", build_seconds=round(time.perf_counter() - t0, 3), model_class=type(model).__name__,
               params=sum(p.numel() for p in model.parameters()))
    vocab = row["vocab"] = vocab_of(model)
    ids = torch.randint(0, vocab, (2, 12), generator=torch.Generator().manual_seed(0))
    try:
        with _quiet(), torch.no_grad():
            t1 = time.perf_counter()
            logits = _logits(model(input_ids=ids, use_cache=False))
            row["forward_seconds"] = round(time.perf_counter() - t1, 3)
        ok_shape = tuple(logits.shape) == (2, 12, vocab)
        row["forward"] = "ok" if ok_shape and bool(torch.isfinite(logits).all()) else (
            "non-finite logits" if ok_shape else f"shape {tuple(logits.shape)} != {(2, 12, vocab)}")
    except Exception as exc:  # noqa: BLE001
        row.update(forward="failed", error=f"forward: {type(exc).__name__}: {_short(exc)}")
    row["config_overrides"] = json.loads(json.dumps(tiny_overrides(model_type), default=str))
    return row


def _short(exc: BaseException) -> str:
    text = " ".join(str(exc).split())
    return text[:300]


def main(argv: list[str] | None = None) -> int:
    """``python -m sinkscope.conformance.tiny OUT.json [TYPE ...]``: build and run every type, one line each."""
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv:
        print("usage: python -m sinkscope.conformance.tiny OUT.json [TYPE ...]", file=sys.stderr)
        return 2
    out_path, only = argv[0], argv[1:]
    torch.set_num_threads(1)
    rows = []
    for t in only or model_types():
        row = check(t)
        rows.append(row)
        status = f"fwd {row.get('forward')} {row.get('params', '')}p" if row.get("build") == "ok" else "build FAILED"
        print(f"{t:<26} {row['class']:<18} {status} {row.get('error', '')}", flush=True)
    must = {"decoder", "hybrid", "multimodal-decoder"}
    failed = {r["type"]: {"error": r.get("error") or r.get("forward"), "why": r.get("known_failure")}
              for r in rows if r["class"] in must and (r.get("build") != "ok" or r.get("forward") != "ok")}
    summary = {"transformers": transformers.__version__, "torch": torch.__version__, "n_types": len(model_types()),
               "ok": len(rows) - len(failed), "failed": failed, "types": {r["type"]: r for r in rows}}
    with open(out_path, "w") as fh:
        json.dump(summary, fh, indent=1, default=str)
    print(json.dumps({k: summary[k] for k in ("ok", "failed")}, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
