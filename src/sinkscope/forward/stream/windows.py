"""``sinkscope stream``'s window reader: what ``runner.run_probes`` is for the other commands (SPEC.md "Streaming").

Same signature as ``run_probes``, so the pipeline's progress, checkpoints, ``--resume``, Ctrl-C
and torchrun (a share of the windows per process) all hold. Per window: the hook-reading probes
(``p0_mass``, ``phantom_mass``) read its first ``max(cache)`` tokens densely through
``run_probes``; then the ``stream`` probe's every reading condition reads the whole window
(``reader.read_stream``, or ``reader.read_masked`` in ``--mode mask``; a sinkscope trainer checkpoint,
which keeps no cache, ``reader.read_native`` in ``--mode mask`` only).

Progress: the bar counts tokens as each chunk is read. A checkpoint may be taken after every
condition (``on_batch_done(window)``: the window in progress, whose read conditions the probe's
state records), and on Ctrl-C or SIGTERM one is taken at once (``on_batch_done(window, force=True)``),
so an interrupted run, even of one document, keeps the conditions it finished and ``--resume``
reads the others (and skips the window's dense probes where one of its conditions was read).

Before the first window two checks stop a run that would measure wrong, each in one sentence:
the streaming reader with nothing evicted must give the model's own dense NLL on a prefix of the
first window (:data:`CHECK_TOKENS`, read in chunks of :data:`CHECK_CHUNK`; relative tolerance as
the capture's check), and with ``--positions cache`` the model's keys must re-rotate
(``rotary.check_rerotation``).
"""

from __future__ import annotations

import sys
from typing import Callable, Sequence

import numpy as np
import torch

from sinkscope.errors import SinkscopeError, option
from sinkscope.probes.base import Probe
from sinkscope.runtime.progress import progress_bar
from sinkscope.capture.discover import input_device
from sinkscope.capture.hooked import is_wrapped as is_hooked
from sinkscope.forward.runner import CHECK_TOLERANCE, is_native, run_probes
from sinkscope.forward.stream import rotary
from sinkscope.kvcache.policies import Policy
from sinkscope.kvcache.quant import LAST_BIT_SENSITIVITY
from sinkscope.kvcache.unquantised import nothing_quantised_note
from sinkscope.forward.stream.reader import (first_layer_keys, layout_of, plain_nll, read_masked, read_native, read_stream,
                                     read_stream_p0)

CHECK_TOKENS = 48
CHECK_CHUNK = 16


def _context(model: torch.nn.Module) -> int | None:
    config = model.config
    return getattr(config, "max_position_embeddings", None) or getattr(config, "n_positions", None)


def _check_reader(model: torch.nn.Module, ids: torch.Tensor, layout) -> None:
    """The streaming reader, nothing evicted, against the model's own dense forward on a prefix."""
    name = getattr(model.config, "model_type", type(model).__name__)
    prefix = ids[:, :CHECK_TOKENS]
    try:
        streamed = read_stream(model, prefix, Policy("full"), layout, chunk=CHECK_CHUNK)
    except SinkscopeError:  # already one sentence (a refused option, say): not an architecture problem
        raise
    except Exception as error:  # an architecture whose cache or masks are not transformers' plain ones
        raise SinkscopeError(f"stream cannot read the {name!r} model through a key-value cache ({type(error).__name__}: "
                             f"{str(error).splitlines()[0][:160] if str(error) else 'no message'}); it reads models whose "
                             "layers keep keys and values in transformers' DynamicCache.") from None
    dense = plain_nll(model, prefix)
    dtype = next(model.parameters()).dtype
    error = float((streamed - dense).abs().max()) / max(1.0, float(dense.abs().max()))
    if not error <= CHECK_TOLERANCE.get(dtype, 5e-2):
        raise SinkscopeError(f"reading the {name!r} model through its cache changes its predictions (by {error:.2g} of "
                             f"their scale on the first {prefix.shape[1]} tokens, nothing evicted), so stream would "
                             "not measure what the model computes; please report the architecture.")


def _check_native(model: torch.nn.Module, stream: Probe, length: int) -> None:
    """A sinkscope trainer model is read mask-based (``reader.read_native``) within its context, or not at all; a
    TransformerLens HookedTransformer (``capture/hooked.py``) is not read at all."""
    if is_hooked(model):
        raise SinkscopeError("stream reads a model through its key-value cache, which a HookedTransformer does not "
                             "expose to sinkscope; measure stream on the transformers model (a TransformerBridge or "
                             "the model it was converted from).")
    if stream.mode != "mask":
        raise SinkscopeError(f"a sinkscope trainer checkpoint keeps no key-value cache, so stream reads it with "
                             f"{option('mode')} mask (the exact mask-based reading, original positions); add {option('mode')} mask.")
    context = model.config.block_size
    if length > context:
        raise SinkscopeError(f"the trainer checkpoint has learned positions up to {context}, so it cannot read "
                             f"{option('length')} {length}; use a {option('length')} of {context} or less.")


def _prepare(model: torch.nn.Module, stream: Probe, tokens: np.ndarray, device: torch.device):
    """A transformers model's :class:`~sinkscope.forward.stream.reader.Layout`, after the two checks (module docstring)."""
    name = getattr(model.config, "model_type", type(model).__name__)
    L = tokens.shape[1]
    layout = layout_of(model, stream.spec.n_layers, L)
    if layout.inv_freq is None and not layout.rotary_problem and (_context(model) or L) < L \
            and "original" in stream.positions:
        raise SinkscopeError(f"the {name!r} model has learned positions up to {_context(model)}, so it cannot read "
                             f"{option('length')} {L} with original positions; use a {option('length')} within its context.")
    with torch.inference_mode():
        first = torch.from_numpy(np.ascontiguousarray(tokens[:1])).to(device)  # (1, L)
        _check_reader(model, first, layout)
        if "cache" in stream.positions:
            rotary.check_rerotation(model, first_layer_keys(model, layout, first[:, :8]), layout.inv_freq,
                                    problem=layout.rotary_problem)
    return layout


def residual_only(conditions) -> list:
    """The ``kivi`` (and ``kivi-grouped``) conditions of a bounded cache whose recent keys never reach the residual
    length (SPEC.md "Quantised KV caches"): ``window`` and ``sinks`` keep ``cache - sink_tokens`` recent keys, fewer
    than R (``kv_residual``, or ``kv_group``)."""
    return [p for p in conditions if p.quantised and p.kv_scheme in ("kivi", "kivi-grouped")
            and p.name in ("window", "sinks") and p.cache - p.sink_tokens < _residual_length(p)]


def _residual_length(policy) -> int:
    """The full-precision keys a ``kivi`` condition gathers before quantising them (``kv_quant.KVQuant``)."""
    return (policy.kv_residual or policy.kv_group) if policy.kv_scheme == "kivi" else policy.kv_group


def _say_backends(conditions, log) -> None:
    """``--kv-backend transformers``: which conditions its ``QuantizedCache`` reads, and why not the others."""
    from sinkscope.kvcache.quant import transformers_why_not as why_not
    from sinkscope.forward.stream.hf_quant import check_available

    served = [p for p in conditions if p.kv_backend == "transformers"]
    if served:
        check_available()
    others = [p for p in conditions if p.quantised and p.kv_backend != "transformers"]
    log(f"Quantised cache: transformers' QuantizedCache (quanto) reads {len(served)} condition(s)"
        + (f"; sinkscope's quantiser reads {len(others)}: " + "; ".join(f"{p.label} ({why_not(p)})" for p in others)
           if others else "") + ".")


def read_windows(
    model: torch.nn.Module,
    tokens: np.ndarray,
    probes: Sequence[Probe],
    *,
    batch_size: int = 1,
    device: torch.device | str | None = None,
    progress: bool = True,
    attention: str = "fused",
    start: int = 0,
    on_batch_done: Callable[[int], None] | None = None,
    log: Callable[[str], None] | None = None,
    inference: bool = True,
) -> int:
    """Read ``tokens[start:]`` (n_windows, L) one window at a time; returns 1 (the batch size)."""
    log = log or (lambda message: print(message, file=sys.stderr))
    stream = next(p for p in probes if p.reads_windows)
    dense_probes = [p for p in probes if not p.reads_windows]
    device = torch.device(device) if device is not None else input_device(model)
    n, L = tokens.shape
    if is_native(model):
        _check_native(model, stream, L)
        layout, read = None, read_native
    else:
        layout, read = _prepare(model, stream, tokens, device), read_masked if stream.mode == "mask" else read_stream
    dense_len = min(L, max(stream.caches))
    conditions = stream.conditions
    log(f"Reading {n - start} document(s) of {L} tokens under {len(conditions)} condition(s): "
        + "; ".join(p.label for p in conditions) + f" (chunks of {stream.chunk}) ...")
    if getattr(stream, "kv_backend", "sinkscope") == "transformers":
        _say_backends(conditions, log)
    if stream.quantises and n == 1:
        log(f"note: one document gives the quantised rows no standard error, and a quantised perplexity moves by up to "
            f"{LAST_BIT_SENSITIVITY} when its input moves by one float32 ulp (SPEC.md \"Quantised KV caches\"); read "
            "--n-seqs 4 or more before calling a smaller difference an effect.")
    idle = [note for note in (nothing_quantised_note(policy, L) for policy in conditions) if note]
    for note in idle:  # one line per quantised condition that holds every key and value exact
        log(note)
    for policy in residual_only(conditions):
        if nothing_quantised_note(policy, L):
            continue  # said above: nothing at all is quantised
        log(f"note: under {policy.label} the {policy.cache - policy.sink_tokens} recent keys never reach the residual "
            f"length of {_residual_length(policy)} that kivi gathers before quantising, so once the cache is full only "
            f"keys quantised before it filled stay quantised; use a --kv-group (and --kv-residual) of "
            f"{policy.cache - policy.sink_tokens} or less, or per-token, to quantise the recent keys.")
    # a checkpoint taken within the window at ``start`` (after a condition): its conditions read, and its dense probes
    resumed = stream.read[:, start] > 0 if start < n else torch.zeros(len(conditions), dtype=torch.bool)  # (C,)
    if resumed.any():
        log(f"{int(resumed.sum())} of {len(conditions)} conditions of window {start} were read before the interruption; "
            f"reading the other {int((~resumed).sum())}.")
    bar = progress_bar(total=(n - start) * len(conditions) * L, initial=int(resumed.sum()) * L, desc="tokens",
                       unit="tok", unit_scale=True, disable=not progress, file=sys.stderr, dynamic_ncols=True)
    counted = [0]

    def advance(tokens: int) -> None:  # the bar moves as each chunk is read, not once per condition
        bar.update(tokens)
        counted[0] += tokens

    consistent = None  # the window a checkpoint taken now resumes at
    before = None  # the dense probes before the window's, until one of its conditions is read
    try:
        for index in range(start, n):
            consistent = index
            done = stream.read[:, index] > 0  # (C,): read before a resume
            if dense_probes and not done.any():
                before = [p.snapshot() for p in dense_probes]
                run_probes(model, tokens[index:index + 1, :dense_len], dense_probes, batch_size=1, device=device,
                           progress=False, attention=attention, log=log, inference=inference)
            ids = torch.from_numpy(np.ascontiguousarray(tokens[index:index + 1])).to(device)  # (1, L)
            for c, policy in enumerate(conditions):
                if done[c]:
                    continue
                counted[0] = 0
                try:
                    with torch.inference_mode():
                        if stream.quantises and read is read_stream and policy.kv_backend != "transformers":
                            # the sink metric and the reduced-precision share of sinkscope's quantised cache beside
                            reading = read_stream_p0(model, ids, policy, layout, chunk=stream.chunk, on_chunk=advance)
                            stream.add_p0(c, index, reading.p0_sum, reading.p0_count)
                            stream.add_quantised(c, index, reading.quantised, reading.held)
                            nll = reading.nll
                        elif read is read_stream:
                            nll = read(model, ids, policy, layout, chunk=stream.chunk, on_chunk=advance)  # (L - 1,)
                        else:  # one dense pass
                            nll = read(model, ids, policy, layout, chunk=stream.chunk)  # (L - 1,)
                except torch.OutOfMemoryError:
                    raise SinkscopeError(f"out of memory reading {policy.label}; use a smaller {option('cache')} or {option('chunk')}, or "
                                         f"leave full out of {option('policy')} for long texts.") from None
                stream.add(c, index, nll)
                before = None  # a resume skips this window's dense probes now
                bar.update(L - counted[0])
                if not progress:  # no bar: one line per condition read says the run moves
                    log(f"Read window {index + 1} of {n} under {policy.label} ({c + 1} of {len(conditions)} conditions).")
                finished = bool((stream.read[:, index] > 0).all())
                consistent = index + 1 if finished else index
                if on_batch_done is not None:  # a checkpoint after every condition: an interrupted document keeps them
                    on_batch_done(consistent)
    except KeyboardInterrupt:
        if consistent is not None and on_batch_done is not None and _takes_force(on_batch_done):
            for probe, state in zip(dense_probes, before or ()):  # no condition of the window read: none of it kept
                probe.restore(state)
            on_batch_done(consistent, force=True)  # the conditions read before the interruption, kept for --resume
        raise
    finally:
        bar.close()
    return 1


def _takes_force(callback: Callable) -> bool:
    """Whether ``callback`` (the pipeline's checkpoint) takes ``force=True``: save now, whenever the last save was."""
    import inspect

    try:
        return "force" in inspect.signature(callback).parameters
    except (TypeError, ValueError):
        return False
