"""The Python API: the CLI's pipeline for notebooks, without typer.

    import sinkscope

    result = sinkscope.measure("sinks", "path/to/model", seq_len=128, n_seqs=8)
    result.table.query("metric == 'p0_mass' and head.isna()")   # per-layer rows
    result.report("runs/p0")                                      # run folder + report.html

``measure`` takes a command name (``"sinks"``, see ``sinkscope ls commands``) or one or more
probe names; a model as a hub id, a folder, a ``.gguf`` file, a trainer checkpoint, an
already-loaded transformers model (with its tokenizer), or a TransformerLens
``TransformerBridge`` (measured through the Hugging Face model it wraps), a TransformerLens 3
``HookedTransformer`` or SAELens ``HookedSAETransformer`` (through its own hooks:
``capture/hooked.py``); and text as the
bundled corpus (default), ``texts=[...]``, a ``text_file=``, or token ids ``windows=`` of
shape (n_seqs, seq_len). Every other keyword is the command's option of the same name (the
CLI's ``--seq-len`` is ``seq_len``). Nothing is written unless ``out=`` is given or the
result is saved.
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from dataclasses import fields
from typing import Callable, Sequence

from sinkscope.errors import SinkscopeError, suggest


def measure(
    what: str | Sequence[str],
    model=None,
    tokenizer=None,
    *,
    texts: str | Sequence[str] | None = None,
    windows=None,
    params: dict[str, dict] | None = None,
    revisions: str | Sequence[str] | None = None,
    group_by: str | None = None,
    log=None,
    **options,
):
    """Run a measuring command (or the named probes) on a model; returns a :class:`~sinkscope.run.result.Result`,
    or for several models or revisions a :class:`~sinkscope.run.result.ComparisonResult`.

    Args:
        what: a command name such as ``"sinks"``, or a probe name, or a list of probe names.
        model: hub id, folder, GGUF file, checkpoint folder, None (the bundled SmolLM2), or a
            loaded ``torch.nn.Module`` (transformers model, trainer model, ``TransformerBridge``,
            ``HookedTransformer``);
            a list of names compares several models (as ``sinkscope sinks A B``).
        revisions: hub revisions of one model (``["step0", "step1000"]`` or ``"step0,step1000"``): its
            checkpoints through training, compared (as ``--revision step0,step1000``).
        group_by: several models: the condition column whose runs the comparison page averages.
        tokenizer: the tokenizer of a loaded model (needed with ``texts`` or the corpus).
        texts: documents to cut into windows instead of the bundled corpus.
        windows: token ids (n_seqs, seq_len) to evaluate as they are.
        params: probe parameters when ``what`` names probes, ``{probe: {name: value}}``.
        log: a function receiving progress messages (default: stderr; none with ``progress=False``).
        **options: the command's options (``seq_len``, ``n_seqs``, ``seed``, ``bos``, ``device``,
            ``dtype``, ``attention``, ``out``, ``progress`` (default True: a progress bar and each phase's
            line on stderr; False runs silently), ...), and where the runs go (docs/scaling.md):
            ``executor="ray"`` or ``"slurm"``, ``jobs=N`` local processes, ``ray_address``,
            ``slurm_partition``, ... (``executors.settings.ExecutorOptions``; these write every run to
            ``out``, which they need, and the result is read back from it).
    """
    try:
        return _measure(what, model, tokenizer, texts=texts, windows=windows, params=params, revisions=revisions,
                        group_by=group_by, log=log, **options)
    except SinkscopeError as error:  # the sentences name options; a notebook user passes keywords
        error.args = (error.phrased("api"),)
        raise


def _measure(what, model, tokenizer, *, texts, windows, params, revisions, group_by, log, **options):
    import torch

    from sinkscope.commands import discover, get_command
    from sinkscope.run.dispatch import measure_command
    from sinkscope.run.prepare import Inputs
    from sinkscope.probes import get_probe
    from sinkscope.models.nnsight_model import is_nnsight_model, unwrapped

    commands = discover()
    _check_what(what)
    if isinstance(model, (list, tuple)) and not model:
        raise SinkscopeError("model= is an empty list; name at least one model (or leave model= out for the bundled "
                             "SmolLM2).")
    if isinstance(what, str) and what in commands:
        command = get_command(what)
        if params:
            raise SinkscopeError(f"params= is for probes named directly; {what!r} takes options as keywords.")
    else:
        names = [what] if isinstance(what, str) else list(what)
        for name in names:
            if name not in commands:
                get_probe(name)  # one sentence for an unknown name
        command = get_command("measure")
        settings = [f"{probe}.{key}={value}" for probe, values in (params or {}).items() for key, value in values.items()]
        options = {**options, "probes": tuple(names), "params": tuple(settings)}
    from sinkscope.executors.settings import EXECUTOR_FIELDS, choose_executor

    executor_options = choose_executor({key: options.pop(key) for key in list(options) if key in EXECUTOR_FIELDS})
    known = {f.name for f in fields(command.options)} - {"model"}
    for key in options:
        if key not in known:
            raise SinkscopeError(f"{command.name} has no option {key!r}{suggest(key, known)}.")
    inputs = Inputs(texts=[texts] if isinstance(texts, str) else (list(texts) if texts is not None else None),
                    windows=windows)
    log = _say(log, options.get("progress", True))
    if not executor_options.in_process:
        return _on_executor(command, options, model, revisions, group_by, executor_options, texts, windows, tokenizer, log)
    if isinstance(model, (list, tuple, set)) or revisions is not None:
        if tokenizer is not None or isinstance(model, set) or any(not isinstance(m, (str, os.PathLike))
                                                                  for m in (model if isinstance(model, (list, tuple)) else [])):
            raise SinkscopeError("several models are compared by name (hub ids or paths, in a list); a loaded model "
                                 "is measured alone.")
        several = list(model) if isinstance(model, (list, tuple)) else model
        run_options = command.options(**_as_tuples(command.options, options))
        return _compare(command, run_options, several, revisions, group_by, inputs, log)
    if is_nnsight_model(model):  # measured through the transformers model it wraps (models/nnsight_model.py)
        model, own_tokenizer = unwrapped(model)
        tokenizer = tokenizer if tokenizer is not None else own_tokenizer
    if isinstance(model, torch.nn.Module):
        _check_loaded(model)
        inputs.model, inputs.tokenizer = model, tokenizer
        model = None
    elif model is not None and not isinstance(model, (str, os.PathLike)):
        raise SinkscopeError(f"model= takes a hub id, a path or a loaded torch module, not a {type(model).__name__}.")
    elif tokenizer is not None:
        raise SinkscopeError("tokenizer= goes with a loaded model; a model named by path or id brings its own.")
    model = os.fspath(model) if isinstance(model, os.PathLike) else model
    run_options = command.options(model=model, **_as_tuples(command.options, options))
    return measure_command(command, run_options, inputs, write=run_options.out is not None, log=log)


def _on_executor(command, options, model, revisions, group_by, executor_options, texts, windows, tokenizer, log):
    """The runs as jobs on ``engine`` (``executors.execute_jobs``), each written to ``out``; the
    :class:`Result` (or :class:`ComparisonResult`) read back from the folders."""
    from pathlib import Path

    from sinkscope.run.dispatch import execute_jobs
    from sinkscope.run.plan import plan
    from sinkscope.run.result import ComparisonResult, Result

    if not options.get("out"):
        raise SinkscopeError(f"executor={executor_options.executor!r} and jobs= run each model in a process of its own, which "
                             "writes its run folder: give out=.")
    if texts is not None or windows is not None or tokenizer is not None or not (
            model is None or isinstance(model, (str, os.PathLike))
            or (isinstance(model, (list, tuple)) and all(isinstance(m, (str, os.PathLike)) for m in model))):
        raise SinkscopeError("a run on an executor reads its model and text by name (hub ids or paths, text_file=); "
                             "loaded models, texts= and windows= are measured in this process.")
    several = list(model) if isinstance(model, (list, tuple)) else model
    run_options = command.options(**_as_tuples(command.options, options))
    plans = plan(command, run_options, models=several, revisions=revisions, group_by=group_by)
    execute_jobs(plans, executor_options, log=log)
    results = [Result.load(p.options.out) for p in plans]
    comparison = plans[0].comparison
    if comparison is None:
        return results[0]
    names = [Path(p.options.out).name for p in plans]
    outcome = ComparisonResult(results, names, list(comparison.labels) if comparison.labels else names,
                               series=comparison.series, group_by=group_by)
    outcome.path = Path(comparison.folder)
    return outcome


def _compare(command, options, models, revisions, group_by, inputs, log):
    """Several models, or one model's revisions: each run in memory, then a ComparisonResult (saved with
    its page in ``options.out`` when given, as the command line does)."""
    from pathlib import Path

    from sinkscope.run.stages import run_plan
    from sinkscope.run.plan import plan
    from sinkscope.run.result import ComparisonResult

    plans = plan(command, options, models=models, revisions=revisions, group_by=group_by, write=False)
    results = [run_plan(p, inputs, write=False, log=log) for p in plans]
    comparison = plans[0].comparison
    if comparison is None:  # one model, one revision: a run alone
        return results[0]
    names = [Path(p.options.out).name for p in plans] if comparison is not None else [p.source.label for p in plans]
    labels = list(comparison.labels) if comparison is not None and comparison.labels else names
    outcome = ComparisonResult(results, names, labels, series=bool(comparison and comparison.series),
                               group_by=group_by)
    if options.out:
        outcome.report(options.out, overwrite=options.overwrite)
    return outcome


def _say(log, progress: bool):
    """Where the run's messages go: ``log`` when given, else stderr (as the command line), or nowhere with
    ``progress=False``."""
    if log is not None:
        return log
    if not progress:
        return lambda _message: None
    import sys

    return lambda message: print(message, file=sys.stderr, flush=True)


def _check_what(what) -> None:
    """``what`` is a command or probe name, or a non-empty list of names: else one sentence naming the argument."""
    names = [what] if isinstance(what, str) else what
    if not isinstance(names, (list, tuple)) or not names or not all(isinstance(name, str) and name for name in names):
        raise SinkscopeError(f"what= takes a command name such as 'sinks', or probe names (a string or a list of "
                             f"strings), not {_short_repr(what)}.")


def _short_repr(value) -> str:
    text = repr(value)
    return f"{type(value).__name__} {text[:60]}{'...' if len(text) > 60 else ''}"


def _check_loaded(model) -> None:
    """A module whose weights are not in memory (the meta device: ``init_empty_weights``, a ``device_map``
    that offloaded everything) has nothing to measure: one sentence, not torch's ``.item()`` error. A
    module with no weights at all has nothing to measure either."""
    if next(iter(model.parameters()), None) is None:
        raise SinkscopeError(f"the {type(model).__name__} given as model= has no weights; sinkscope measures "
                             "transformers causal LMs and its own trainer's models.")
    if any(tensor.is_meta for tensor in (*model.parameters(), *model.buffers())):
        raise SinkscopeError("the model's weights are on the meta device (created without loading them, as "
                             "init_empty_weights does); load the weights, then measure.")


def _as_tuples(options_cls: type, options: dict) -> dict:
    """Options the CLI repeats (tuple fields) take one value or a list too: "0.1" -> ("0.1",), 6 -> (6,)."""
    repeated = {f.name for f in fields(options_cls) if str(f.type).startswith("tuple")}

    def as_tuple(value):
        if isinstance(value, (str, bytes)) or not isinstance(value, Iterable):
            return (value,)
        return tuple(value)

    out = {key: as_tuple(value) if key in repeated and value is not None else value
           for key, value in options.items()}
    if isinstance(out.get("seq_len"), (list, tuple)):  # several lengths: seq_len=[128, 512]
        out["seq_len"] = tuple(out["seq_len"])
    elif isinstance(out.get("seq_len"), str):
        from sinkscope.commands.spec import parse_seq_len

        out["seq_len"] = parse_seq_len(out["seq_len"])
    return out


def trace(
    model=None,
    text_or_ids="The quick brown fox jumps over the lazy dog.",
    tokenizer=None,
    *,
    names: str | Sequence[str] | Callable[[str], bool] | None = None,
    attention: str = "fused",
    device: str = "auto",
    dtype: str = "float32",
    bos: bool | None = None,
    trust_remote_code: bool = False,
):
    """One prompt's internals, TransformerLens-style: attention patterns, scores, q/k/v, the residual stream.

    The same capture the probes read (``forward.trace``), one forward pass, every tensor on the CPU
    in float32 with a batch dimension of one and keyed by TransformerLens's hook names, as
    ``run_with_cache`` returns them::

        tr = sinkscope.trace("EleutherAI/pythia-160m", "The quick brown fox")
        tr["blocks.3.attn.hook_pattern"]      # (1, H, T, T): a_ij, SPEC.md "Position-0 mass"
        tr.pattern(3)[0, 1, :, 0]             # head 1's weight on key 0, per query
        tr.tokens                             # the prompt's token ids (1, T), tr.str_tokens its pieces

    Args:
        model: a loaded transformers causal LM or trainer model, an nnsight ``LanguageModel`` (the model it
            wraps), or what the command line takes as MODEL (a hub id, a folder, a .gguf file, a trainer
            checkpoint; None: the bundled default). A HookedTransformer is one sentence: its own
            ``run_with_cache`` gives these names.
        text_or_ids: a text (tokenised with the model's tokenizer, its BOS by the tokenizer's own rule
            unless ``bos`` says otherwise) or one prompt's token ids, (T,) or (1, T).
        tokenizer: for a loaded model and a text.
        names: the hook names to keep (a name, a list of names, or a predicate on names, as
            TransformerLens's ``names_filter``); None keeps every name the model has
            (``sinkscope ls hooks MODEL``). Patterns are (H, T, T) per layer: name what you need on long prompts.
        attention: ``fused`` (the patterns recomputed from q and k exactly as the measurement reads them)
            or ``eager`` (read from the model's own eager attention).
        device: where a model named by path is loaded (``auto``: cuda if available, else cpu).
        dtype: what a model named by path is loaded in (``float32``, ``bfloat16``/``bf16``, ...).
        trust_remote_code: a model named by path may run its repository's code.

    Returns:
        a ``Trace``: a mapping from hook names to tensors, with ``tokens``, ``str_tokens`` and
        ``pattern(layer)`` / ``scores(layer)``.
    """
    import torch

    from sinkscope.capture.hooked import is_hooked_transformer
    from sinkscope.forward.trace import as_ids, trace_ids
    from sinkscope.models.nnsight_model import is_nnsight_model, unwrapped

    if is_hooked_transformer(model):
        raise SinkscopeError("a HookedTransformer's own run_with_cache gives these names; sinkscope.trace reads "
                             "transformers models and trainer checkpoints (sinkscope.measure takes a HookedTransformer).")
    if is_nnsight_model(model):  # the transformers model it wraps
        model, own_tokenizer = unwrapped(model)
        tokenizer = tokenizer if tokenizer is not None else own_tokenizer
    if isinstance(model, torch.nn.Module):
        _check_loaded(model)
        ids = as_ids(text_or_ids, tokenizer, bos)
        return trace_ids(model, ids, tokenizer, names=names, attention=attention)
    if tokenizer is not None:
        raise SinkscopeError("tokenizer= goes with a loaded model; a model named by path or id brings its own.")
    from sinkscope.models.resolve import resolve_source
    from sinkscope.run.loaders import load_model

    name = os.fspath(model) if isinstance(model, os.PathLike) else model
    loaded = load_model(resolve_source(name), device=device, dtype=dtype,
                        trust_remote_code=trust_remote_code, log=lambda _message: None)
    ids = as_ids(text_or_ids, loaded.tokenizer, bos)
    return trace_ids(loaded.model, ids, loaded.tokenizer, names=names, attention=attention)
