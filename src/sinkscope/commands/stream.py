"""``sinkscope stream``: a long text read through a bounded KV cache, per policy (SPEC.md "Streaming"; the learned-sinks note).

Each window is a document of ``--length`` tokens (the corpus's windowing rule at that length; it
may exceed the model's context, which is the point: a rotary model read with ``--positions
original`` past its context is what StreamingLLM shows breaking). Every document is read once per
reading condition (``probes/stream_nll.reading_conditions``): ``full`` (the dense reference),
``window`` (the ``--cache`` most recent keys), ``sinks`` (the first ``--sink-tokens`` tokens plus
the most recent), ``h2o`` (heavy hitters by accumulated attention plus the most recent), for each
cache size and position convention (``--positions cache``: positions within the cache, keys
re-rotated, rotary models only; ``original``: kvpress's). On a learned-sink model (gpt-oss)
``window`` is the phantom alone. ``--mode stream`` (default) reads ``--chunk`` tokens per forward
pass through transformers' cache, so memory is bounded by the cache; ``--mode mask`` is the exact
mask-based reference for short texts (static policies, original positions).

Beside the NLL, ``p0_mass`` (and ``phantom_mass`` on a learned-sink model) is measured on the
first ``max(--cache)`` tokens of the same documents, read densely, so a reader can see whether the
sink metrics predict which models need sink tokens. The run folder adds ``stream_nll.npy``
(conditions x windows x (L - 1) float32; the conditions in the manifest's ``probes.stream``).
"""

from __future__ import annotations

from dataclasses import dataclass

from sinkscope.commands import register_command
from sinkscope.errors import SinkscopeError, option, whole_number
from sinkscope.commands.spec import Command, RunOptions, split_values

POLICIES = ("full", "window", "sinks", "h2o")  # cache.POLICIES, without importing torch
POSITIONS = ("cache", "original")
MODES = ("stream", "mask")
KV_BITS = (16, 8, 4, 3, 2)  # kv_quant.BITS, without importing torch
KV_SCHEMES = ("kivi", "kivi-grouped", "per-token")  # kv_quant.SCHEMES
#: the mask-based mode materialises an L x L mask: longer documents are refused.
MASK_MODE_MAX_LENGTH = 4096
#: documents read by default when ``--kv-bits`` quantises: a quantised perplexity moves with the last bit of
#: its input (SPEC.md "Quantised KV caches", noise), so each quantised row gets a standard error over documents.
QUANTISED_DOCUMENTS = 4


def quantises(kv_bits) -> bool:
    """Whether ``--kv-bits`` asks for a quantised cache (any value but 16; unparsable values are left to the check)."""
    return any(value != "16" for value in split_values(kv_bits))


@dataclass
class StreamOptions(RunOptions):
    """``RunOptions`` plus the reading conditions (``--seq-len`` is ``--length``; one document per batch).

    Attributes:
        n_seqs: documents; None: 1, or ``QUANTISED_DOCUMENTS`` (4) when ``kv_bits`` quantises, so every
            quantised row has a standard error over documents.
        length: tokens per document (window), BOS included; may exceed the model's context.
        cache: cache sizes (the keys a cache holds when a token arrives; exact at any --chunk).
        sink_tokens: the ``sinks`` policy's first tokens (0 = ``window``).
        policy: policies among full, window, sinks, h2o.
        positions: ``cache`` and/or ``original``.
        chunk: tokens per forward pass; the cache is cut back after each.
        mode: ``stream`` or ``mask`` (the exact reference).
        h2o_recent: h2o's share of the budget for recent keys.
        bucket: tokens per position bucket of the table and figures.
        kv_bits: bits of the cached keys and values (16 = not quantised; SPEC.md "Quantised KV caches").
        kv_group: elements per quantisation group.
        kv_scheme: ``kivi``, ``kivi-grouped`` and/or ``per-token`` (the group layout).
        kv_residual: ``kivi``'s residual length R, a multiple of every ``kv_group`` (0: each group's size).
        protect_sinks: the document's first tokens kept in full precision.
        protect: keys kept in full precision by a rule, ``top-p0:N`` or ``random:N``.
        kv_backend: ``sinkscope`` (its quantiser) or ``transformers`` (``QuantizedCache`` where it serves).
    """

    n_seqs: int | None = None
    length: int = 2048
    cache: tuple = (256,)
    sink_tokens: tuple = (4,)
    policy: tuple = POLICIES
    positions: tuple = ("cache",)
    chunk: int = 64
    mode: str = "stream"
    h2o_recent: float = 0.5
    bucket: int = 256
    kv_bits: tuple = (16,)
    kv_group: tuple = (64,)
    kv_scheme: tuple = ("kivi",)
    kv_residual: int = 0
    protect_sinks: tuple = (0,)
    protect: tuple = ()
    kv_backend: str = "sinkscope"

    def __post_init__(self):
        if self.n_seqs is None:  # 1 document, or QUANTISED_DOCUMENTS when the cache is quantised
            self.n_seqs = QUANTISED_DOCUMENTS if quantises(self.kv_bits) else 1
        super().__post_init__()
        self.batch_size = 1


def _whole(name: str, values, minimum: int) -> tuple:
    try:
        numbers = tuple(int(v) for v in split_values(values))
    except ValueError:
        raise SinkscopeError(f"{name} takes whole numbers such as 128,256,512 (got {values!r}).") from None
    if not numbers or min(numbers) < minimum:
        raise SinkscopeError(f"{name} takes whole numbers >= {minimum} (got {values!r}).")
    if len(set(numbers)) != len(numbers):
        raise SinkscopeError(f"{name} lists a value twice ({', '.join(map(str, numbers))}).")
    return numbers


def _check(options: StreamOptions) -> None:
    if not isinstance(options.length, int) or options.length < 2:
        raise SinkscopeError(f"{option('length')} must be at least 2 tokens (got {options.length}).")
    if options.seq_len not in (None, options.length):
        raise SinkscopeError(f"stream's documents are {option('length')} tokens long; it takes no {option('seq_len')}.")
    options.seq_len = options.length
    options.batch_size = 1
    options.cache = _whole("--cache", options.cache, 1)
    options.sink_tokens = _whole("--sink-tokens", options.sink_tokens, 0)
    for name, values, known in (("--policy", options.policy, POLICIES), ("--positions", options.positions, POSITIONS)):
        parsed = split_values(values)
        bad = [v for v in parsed if v not in known]
        if bad or not parsed:
            raise SinkscopeError(f"unknown {name} {bad[0] if bad else ''!r}; use one or more of {', '.join(known)}.")
        if len(set(parsed)) != len(parsed):
            raise SinkscopeError(f"{name} lists a value twice ({', '.join(parsed)}).")
    options.policy, options.positions = split_values(options.policy), split_values(options.positions)
    if not isinstance(options.chunk, int) or options.chunk < 1:
        raise SinkscopeError(f"{option('chunk')} must be at least 1 token (got {options.chunk}).")
    if not isinstance(options.bucket, int) or options.bucket < 1:
        raise SinkscopeError(f"{option('bucket')} must be at least 1 token (got {options.bucket}).")
    if not 0 < options.h2o_recent < 1:
        raise SinkscopeError(f"{option('h2o_recent')} is a share of the cache and must lie in (0, 1) (got {options.h2o_recent:g}).")
    _check_quantisation(options)
    if options.mode not in MODES:
        raise SinkscopeError(f"unknown {option('mode')} {options.mode!r}; use stream or mask.")
    if options.mode == "mask":
        if any(bits != 16 for bits in options.kv_bits):
            raise SinkscopeError(f"{option('mode')} mask reads with no cache, so it cannot quantise one; use {option('mode')} "
                                 f"stream with {option('kv_bits')}.")
        if "h2o" in options.policy:
            raise SinkscopeError(f"h2o's cache depends on the attention it reads, so {option('mode')} mask cannot show it; "
                                 f"drop h2o from {option('policy')} or use {option('mode')} stream.")
        if "cache" in options.positions:
            raise SinkscopeError(f"{option('mode')} mask keeps original positions; use {option('positions')} original or {option('mode')} stream.")
        if options.length > MASK_MODE_MAX_LENGTH:
            raise SinkscopeError(f"{option('mode')} mask materialises a {option('length')} x {option('length')} mask; use {option('length')} "
                                 f"{MASK_MODE_MAX_LENGTH} or less, or {option('mode')} stream.")
    # Every requested (policy, cache) pair runs, or the run is refused here: none is dropped silently.
    if "h2o" in options.policy and min(options.cache) < 2:
        raise SinkscopeError(f"h2o keeps at least one heavy and one recent key, so it needs {option('cache')} 2 or more "
                             f"(got {option('cache')} {','.join(map(str, options.cache))}).")
    _check_protection_fits(options)
    if "sinks" in options.policy:
        short = [(n, c) for n in options.sink_tokens for c in options.cache if n > 0 and n >= c]
        if short:
            n, c = short[0]
            raise SinkscopeError(f"{option('sink_tokens')} {n} leaves no recent key in a cache of {c}; use fewer sink tokens or "
                                 f"a larger {option('cache')}.")


def _check_protection_fits(options: StreamOptions) -> None:
    """A protection that keeps every key a quantised cache holds quantises nothing: its rows would show the
    unquantised perplexity under a quantised label (issue 60), so it is refused naming the cache."""
    if all(bits == 16 for bits in options.kv_bits):
        return
    held = [options.length] if "full" in options.policy else []
    held += [c for c in options.cache if any(p != "full" for p in options.policy)]
    smallest = min(held)
    counts = [(f"{option('protect_sinks')} {n}", n) for n in options.protect_sinks]
    counts += [(f"{option('protect')} {rule}", whole_number(str(rule).partition(":")[2]) or 0) for rule in options.protect]
    for what, n in counts:
        if n >= smallest:
            raise SinkscopeError(f"{what} keeps every key of a cache of {smallest}, so its quantised rows would equal the "
                                 f"unquantised ones; protect fewer keys than the smallest cache read ({smallest}).")


def _check_quantisation(options: StreamOptions) -> None:
    """``--kv-bits``, ``--kv-group``, ``--kv-scheme``, ``--protect-sinks``, parsed and checked."""
    options.kv_bits = _whole("--kv-bits", options.kv_bits, 2)
    bad = [b for b in options.kv_bits if b not in KV_BITS]
    if bad:
        raise SinkscopeError(f"{option('kv_bits')} takes {', '.join(map(str, KV_BITS))} (16 = not quantised), not {bad[0]}.")
    options.kv_group = _whole("--kv-group", options.kv_group, 2)
    options.protect_sinks = _whole("--protect-sinks", options.protect_sinks, 0)
    schemes = split_values(options.kv_scheme)
    unknown = [s for s in schemes if s not in KV_SCHEMES]
    if unknown or not schemes or len(set(schemes)) != len(schemes):
        raise SinkscopeError(f"{option('kv_scheme')} takes {' and/or '.join(KV_SCHEMES)} once each (got {options.kv_scheme!r}).")
    options.kv_scheme = tuple(schemes)
    _check_residual(options)
    rules = split_values(options.protect) if options.protect else []
    for rule in rules:
        kind, _, count = str(rule).partition(":")
        if kind not in ("top-p0", "random") or (whole_number(count) or 0) < 1:
            raise SinkscopeError(f"{option('protect')} takes top-p0:N (the N keys of highest attention) or random:N, N >= 1 "
                                 f"(got {rule!r}).")
    if len(set(rules)) != len(rules):
        raise SinkscopeError(f"{option('protect')} lists a rule twice ({', '.join(rules)}).")
    options.protect = tuple(rules)
    if options.kv_backend not in ("sinkscope", "transformers"):
        raise SinkscopeError(f"unknown {option('kv_backend')} {options.kv_backend!r}; use sinkscope or transformers.")


def _check_residual(options: StreamOptions) -> None:
    """``--kv-residual``: 0 (each group's size) or a multiple of every ``--kv-group`` (KIVI quantises whole groups)."""
    residual = whole_number(options.kv_residual)
    if residual is None or residual < 0:
        raise SinkscopeError(f"{option('kv_residual')} takes a whole number of tokens, 0 for the group size "
                             f"(got {options.kv_residual!r}).")
    uneven = [g for g in options.kv_group if residual % g]
    if uneven:
        raise SinkscopeError(f"{option('kv_residual')} must be a multiple of the group size {uneven[0]} (got {residual}): "
                             f"KIVI quantises whole groups of keys.")
    options.kv_residual = residual


def _probes(options: StreamOptions, spec) -> list[tuple[str, dict]]:
    params = {"policies": tuple(options.policy), "caches": tuple(options.cache),
              "sink_tokens": tuple(options.sink_tokens), "positions": tuple(options.positions),
              "chunk": options.chunk, "mode": options.mode, "h2o_recent": float(options.h2o_recent),
              "bucket": options.bucket, "length": options.length, "n_windows": options.n_seqs,
              "kv_bits": tuple(options.kv_bits), "kv_group": tuple(options.kv_group),
              "kv_scheme": tuple(options.kv_scheme), "protect_sinks": tuple(options.protect_sinks),
              "protect": tuple(options.protect), "kv_backend": options.kv_backend,
              "kv_residual": options.kv_residual}
    beside = [("p0_mass", {})] + ([("phantom_mass", {})] if spec.has_phantom else [])
    return [("stream", params), *beside]


def _read_windows(*args, **kwargs):
    from sinkscope.forward.stream.windows import read_windows

    return read_windows(*args, **kwargs)


STREAM = register_command(Command(
    name="stream",
    summary="a long text through a bounded KV cache: per-token NLL per policy (full, window, sinks, h2o), "
            "cache size and position convention",
    options=StreamOptions,
    probes=_probes,
    check=_check,
    read_windows=_read_windows,
    reads_past_context=True,
))
