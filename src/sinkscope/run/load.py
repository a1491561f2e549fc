"""Stage 2 of a run: the tokenizer first (a corpus too short for the windows costs seconds, not a
model load), the windows, then the model in the requested dtype (``run.loaders``), its spec and
the checks that need them; a :class:`Loaded`.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field, replace

from sinkscope.capture.families import layer_windows, ModelSpec
from sinkscope.commands.spec import longest, seq_lens
from sinkscope.data import corpus as corpus_mod
from sinkscope.data.corpus import given_windows as _given_windows
from sinkscope.errors import SinkscopeError
from sinkscope.forward.runner import check_capture
from sinkscope.capture.hooked import HookedModel, attached_saes, is_hooked_transformer
from sinkscope.models.bridge import is_bridge, unbridged
from sinkscope.models.model_config import vocab_size
from sinkscope.models.resolve import Source
from sinkscope.models.trained_context import learned_positions, require_positions, warn_past_context
from sinkscope.probes import get_probe
from sinkscope.run.hooked_loader import load_hooked
from sinkscope.run.loaders import embedding_rows, load_model, load_tokenizer, LoadedModel, remote_code_note
from sinkscope.run.prepare import _model_context, Prepared


@dataclass
class Loaded:
    """The model, its windows and what loading cost."""

    model: LoadedModel
    windows: corpus_mod.Windows
    spec: ModelSpec
    load_s: float
    #: the logits check of the capture on the first window (``runner.check_capture``), for the manifest
    capture_check: dict = field(default_factory=dict)
    #: the model's trained context (``trained_context.config_context``), None where its config does not say
    trained_context: int | None = None



def _windows(prepared: Prepared, tokenizer, log) -> corpus_mod.Windows:
    options, corpus = prepared.options, prepared.corpus
    inputs = getattr(options, "inputs", "text")
    if inputs != "text":  # sinks --inputs random | repeated: Gu et al.'s inputs, no corpus read
        bos_id = corpus_mod.resolve_bos(options.bos, tokenizer)
        special = set(getattr(tokenizer, "all_special_ids", None) or [])
        windows, prepared.inputs_record = corpus_mod.synthetic_windows(
            inputs, len(tokenizer), special, seq_len=longest(options.seq_len), n_seqs=options.n_seqs,
            seed=options.seed, bos_id=bos_id)
        log(f"Drawing {options.n_seqs} windows of {inputs} tokens ...")
        return windows
    log(f"Tokenising the corpus {corpus.describe()} ...")
    bos_id = corpus_mod.resolve_bos(options.bos, tokenizer)
    doc_ids = corpus_mod.tokenize_documents(tokenizer, corpus.documents)
    if prepared.command.one_window:  # explore: the text itself, its first seq_len tokens
        windows = corpus_mod.text_window(doc_ids, seq_len=longest(options.seq_len), bos_id=bos_id)
        prepared.options = replace(options, seq_len=int(windows.tokens.shape[1]), n_seqs=1)
        return windows
    source = prepared.source
    hint = ("; a trigger-task checkpoint's vocabulary is its task's words: measure it without a text, on its own "
            "validation windows") if source.kind == "checkpoint" else ""
    corpus_mod.check_unknown_share(doc_ids, tokenizer, source.label or source.location, log, hint)
    return corpus_mod.make_windows(doc_ids, seq_len=longest(options.seq_len), n_seqs=options.n_seqs, seed=options.seed,
                                   bos_id=bos_id)


def _checkpoint_windows(prepared: Prepared, log) -> corpus_mod.Windows:
    """A trainer checkpoint's validation windows (``train.tasks.checkpoint_windows``); fixes seq_len."""
    from sinkscope.train.tasks import checkpoint_windows

    options = prepared.options
    log(f"Drawing {options.n_seqs} windows from the validation split of {prepared.source.location} (pass "
        "--text-file to measure other text) ...")
    windows = checkpoint_windows(prepared.source.path, seq_len=longest(options.seq_len), n_seqs=options.n_seqs,
                                 seed=options.seed)
    if len(seq_lens(options.seq_len) or ()) <= 1:
        prepared.options = replace(options, seq_len=int(windows.tokens.shape[1]))
    return windows


def load(prepared: Prepared, log) -> Loaded:
    """Tokenizer, windows, model (in the requested dtype), its spec; checks that need them."""
    options, inputs = prepared.options, prepared.inputs
    windows = _given_windows(inputs.windows) if inputs.windows is not None else None
    started = time.perf_counter()
    if inputs.model is not None:
        model, tokenizer = inputs.model, inputs.tokenizer
        if is_bridge(model):
            model = prepared.cleanup.enter_context(unbridged(model))
            tokenizer = tokenizer if tokenizer is not None else getattr(inputs.model, "tokenizer", None)
        elif is_hooked_transformer(model):  # measured through its own hooks (capture/hooked.py)
            saes = attached_saes(model)
            if saes:
                log(f"note: SAEs are attached at {', '.join(saes)}; the measurement sees the model as it runs, SAEs "
                    "included.")
            model = HookedModel(model)
            tokenizer = tokenizer if tokenizer is not None else getattr(inputs.model, "tokenizer", None)
        if windows is None and tokenizer is None:
            raise SinkscopeError("texts need a tokenizer: pass tokenizer=..., or token ids as windows=...")
        prepared.cleanup.callback(model.train, model.training)  # a caller's model leaves in the mode it came in
        loaded = LoadedModel(model.eval(), tokenizer, prepared.source, next(model.parameters()).dtype,
                             next(model.parameters()).device)
    else:
        if prepared.checkpoint_split:
            windows = _checkpoint_windows(prepared, log)
            options = prepared.options
        note = remote_code_note(prepared.source) if options.trust_remote_code else None
        if note:
            log(f"trust_remote_code: {note}")
        tokenizer = load_tokenizer(prepared.source, trust_remote_code=options.trust_remote_code)
        if windows is None and tokenizer is not None:
            windows = _windows(prepared, tokenizer, log)
            options = prepared.options  # a one-window command's length is its text's
            corpus_mod.check_token_range(windows.tokens, vocab_size(prepared.source))
        _check_same_windows(prepared, windows)  # before the model loads, when the tokenizer came first
        log(f"Loading {prepared.source.label or prepared.source.location} ...")
        _warn_if_unfinished(prepared.source, log)
        if options.loader == "transformer-lens":  # a HookedTransformer built by TransformerLens (run/hooked_loader.py)
            loaded = load_hooked(prepared.source, device=prepared.device, dtype=options.dtype,
                                 loader_option=options.loader_option, trust_remote_code=options.trust_remote_code,
                                 tokenizer=tokenizer, log=log)
        else:
            loaded = load_model(prepared.source, device=prepared.device, dtype=options.dtype,
                                device_map=options.device_map, trust_remote_code=options.trust_remote_code,
                                tokenizer=tokenizer, log=log)
    load_s = time.perf_counter() - started
    spec = ModelSpec.from_model(loaded.model)  # also rejects unsupported families
    trained = _model_context(loaded.model)
    if not prepared.command.reads_past_context:  # a learned table stops the run; computed positions warn (models/trained_context.py)
        require_positions(longest(options.seq_len), learned_positions(loaded.model))
        warn_past_context(longest(options.seq_len), trained, log)
    prepared.command.check_model(options, spec)
    if windows is None:
        windows = _windows(prepared, loaded.tokenizer, log)
        options = prepared.options
    _check_same_windows(prepared, windows)
    corpus_mod.check_token_range(windows.tokens, embedding_rows(loaded.model))
    _fill_bos_token_id(prepared, loaded.tokenizer, windows)
    _check_measurable(prepared, loaded.model, spec, int(windows.tokens.shape[1]))
    check = check_capture(loaded.model, windows.tokens, attention=options.attention,
                          device=None if options.device_map else loaded.device)
    return Loaded(loaded, windows, spec, load_s, check, trained)


def _check_same_windows(prepared: Prepared, windows: corpus_mod.Windows | None) -> None:
    """A run of a series measures the first one's token windows, or stops in one sentence (before its model loads)."""
    if windows is None or prepared.expect_tokens is None or windows.sha256 == prepared.expect_tokens:
        return
    what = prepared.source.location + (f" at revision {prepared.source.revision}" if prepared.source.revision else "")
    raise SinkscopeError(f"{what} turns the corpus into other token windows than the first of the series (its "
                         "tokenizer differs), so its numbers would not be comparable; measure it on its own.")


def _check_measurable(prepared: Prepared, model, spec: ModelSpec, seq_len: int) -> None:
    """One sentence, before the run, for a probe that could only write an empty table on this model."""
    windows = layer_windows(model, spec.n_layers)
    for name, _ in prepared.command.probes(prepared.options, spec):
        reason = get_probe(name).unmeasurable(spec, windows, seq_len)
        if reason:
            raise SinkscopeError(f"the probe {name} cannot measure this model: {reason}.")
    from sinkscope.store.explorer_format import check_heads_exist

    check_heads_exist(prepared.options.explore_heads, spec.n_layers, spec.n_heads, spec.attention_layers)


def _warn_if_unfinished(source: Source, log) -> None:
    """A trainer checkpoint short of its schedule (stopped with --stop-at, interrupted) is measured with a warning."""
    if source.kind != "checkpoint":
        return
    from sinkscope.models.checkpoint_folder import read_config

    meta = read_config(source.path)
    recorded = meta.get("train_options")
    step, steps = meta.get("step"), recorded.get("steps") if isinstance(recorded, dict) else None
    if isinstance(step, int) and isinstance(steps, int) and step < steps:
        log(f"warning: the checkpoint {source.location} is at step {step} of the {steps} its training was scheduled "
            "for (stopped or interrupted); it is measured as it is (continue it with `sinkscope train --resume`).")


def _fill_bos_token_id(prepared: Prepared, tokenizer, windows: corpus_mod.Windows) -> None:
    """A command whose options have ``bos_token_id`` (``circuit``) gets the tokenizer's BOS id there, if unset.

    Else the windows' BOS; it stays None when neither has one. Filled before the run, so the
    manifest and the resume fingerprint record the id used.
    """
    if not hasattr(prepared.options, "bos_token_id") or prepared.options.bos_token_id is not None:
        return
    bos = getattr(tokenizer, "bos_token_id", None)
    bos = bos if bos is not None else windows.bos_id
    if bos is not None:
        prepared.options = replace(prepared.options, bos_token_id=int(bos))
