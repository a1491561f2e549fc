"""Probe ``stream``: the per-token NLL of a document read through a bounded KV cache (SPEC.md "Streaming").

Unlike every other probe it reads no hook point of one forward pass: ``sinkscope stream``'s
window reader (``commands/stream.py``) reads each window, a document of ``--length`` tokens,
once per reading condition (``cache.Policy``: policy x cache x sink tokens x
positions) through ``stream.reader`` and hands the probe the per-token NLL. The probe keeps every
token's NLL, ``nll`` (conditions, windows, L - 1) float32 on the CPU, so the table, the figures and
``stream_nll.npy`` come from the same numbers; a run's share of the windows fills its rows, so
shares merge by addition (torchrun) and a checkpoint resumes at the next window.

Rows, per condition (columns ``policy``, ``cache``, ``sink_tokens``, ``positions``): the mean NLL
over every predicted token of every window (``stream_nll``, nats; ``se`` the standard error over
windows of the per-window means) and ``stream_ppl = exp(stream_nll)``; the same per position
bucket (``position_bucket`` = the first position of a bucket of ``bucket`` tokens, the position of
a value being that of the token it predicts, 1 .. L - 1). ``n`` is the windows (documents) read, the
unit of ``se`` on every row (SPEC.md "Tables"), not the predicted tokens: those are ``n x (L - 1)``
(``n`` times the bucket's tokens on a bucket row). A run that quantises adds, per condition read by
sinkscope's quantiser, ``stream_p0_mass`` (the sink through the cache) and ``stream_quantised_share``
(the share of the cache held in reduced precision; SPEC.md "Quantised KV caches").
"""

from __future__ import annotations

import math
from dataclasses import replace

import torch
from torch import Tensor

from sinkscope.errors import SinkscopeError, whole_number
from sinkscope.probes.base import Param, Probe, register_probe
from sinkscope.store.results import MetricInfo, Row
from sinkscope.kvcache.policies import POLICIES, POSITIONS, Policy, parse_protect
from sinkscope.kvcache.quant import BITS, SCHEMES, transformers_serves

SOURCE = "SPEC.md Streaming; Xiao et al. 2023 (StreamingLLM) Fig. 3; Zhang et al. 2023 (H2O)"


def _positive(values) -> str | None:
    def whole(v) -> bool:
        n = whole_number(v) if isinstance(v, (int, str)) else None
        return n is not None and n >= 1
    return None if all(whole(v) for v in values) else "must hold whole numbers >= 1"


def _bits(values) -> str | None:
    return None if all(whole_number(v) in BITS for v in values) else \
        f"must hold bit widths among {', '.join(map(str, BITS))}"


def _groups(values) -> str | None:
    return None if all((whole_number(v) or 0) >= 2 for v in values) else "must hold whole numbers >= 2"


def _counts(values) -> str | None:
    return None if all(whole_number(v) is not None for v in values) else "must hold whole numbers >= 0"


def _rules(values) -> str | None:
    return None if all(parse_protect(v) for v in values) else "must hold top-p0:N or random:N (N >= 1)"


def reading_conditions(policies: tuple, caches: tuple, sink_tokens: tuple, positions: tuple,
                       h2o_recent: float, kv_bits: tuple = (16,), kv_groups: tuple = (64,),
                       kv_schemes: tuple = ("kivi",), protect_sinks: tuple = (0,), protect: tuple = (),
                       kv_backend: str = "sinkscope", kv_residual: int = 0) -> list[Policy]:
    """Every reading condition of a run, in table order: full once, then per positions and cache.

    ``sinks`` with 0 sink tokens is ``window``; a sink count that leaves no recent key (>= cache)
    is skipped. ``h2o``'s recent share of the budget is ``h2o_recent`` (at least one key each way).
    Each condition is read once per cache quantisation (``kv_quantisations``), 16 bits first; with
    ``kv_backend`` ``transformers``, by transformers' ``QuantizedCache`` where it serves the condition
    (``kv_quant.transformers_serves``), else by sinkscope's quantiser.
    """
    conditions = _policies(policies, caches, sink_tokens, positions, h2o_recent)
    settings = kv_quantisations(kv_bits, kv_groups, kv_schemes, protect_sinks, protect, kv_residual)
    read = [replace(policy, **setting) for policy in conditions for setting in settings]
    if kv_backend == "transformers":
        read = [replace(p, kv_backend="transformers") if transformers_serves(p) else p for p in read]
    return read


def kv_quantisations(kv_bits: tuple, kv_groups: tuple, kv_schemes: tuple, protect_sinks: tuple,
                     protect: tuple = (), kv_residual: int = 0) -> list[dict]:
    """The cache quantisations of a run, as ``Policy`` fields: 16 bits once (nothing to group or
    protect), then every bits x scheme x group x protection, where the protections are each
    ``protect_sinks`` count, then each ``protect`` rule (``top-p0:N``, ``random:N``). ``kivi``'s
    residual length is ``kv_residual``, or each group's size when 0."""
    settings = [{}] if 16 in kv_bits else []
    guards = [dict(protect_sinks=n) for n in protect_sinks] + [dict(protect=rule) for rule in protect]
    settings += [dict(kv_bits=bits, kv_group=group, kv_scheme=scheme, kv_residual=kv_residual or group, **guard)
                 for bits in kv_bits if bits != 16 for scheme in kv_schemes for group in kv_groups
                 for guard in guards]
    return settings


def _policies(policies: tuple, caches: tuple, sink_tokens: tuple, positions: tuple, h2o_recent: float) -> list[Policy]:
    """The policy conditions, unquantised (:func:`reading_conditions`)."""
    conditions: list[Policy] = [Policy("full")] if "full" in policies else []
    for where in positions:
        for cache in caches:
            if "window" in policies or ("sinks" in policies and 0 in sink_tokens):
                conditions.append(Policy("window", cache, 0, where))
            if "sinks" in policies:
                conditions += [Policy("sinks", cache, n, where) for n in sink_tokens if 0 < n < cache]
            if "h2o" in policies and cache >= 2:
                recent = min(cache - 1, max(1, round(cache * h2o_recent)))
                conditions.append(Policy("h2o", cache, 0, where, recent))
    missing = [name for name in policies if name != "full"
               and not any(c.name == name or (name == "sinks" and c.name == "window" and 0 in sink_tokens)
                           for c in conditions)]
    if missing:  # never a run "under 0 conditions": a requested policy that cannot run is one sentence
        raise SinkscopeError(f"the {missing[0]} policy cannot read with a cache of "
                             f"{', '.join(map(str, caches))} (h2o needs 2 keys or more, sinks more keys than sink "
                             "tokens); give a larger cache.")
    return conditions


@register_probe(
    "stream",
    metrics={
        "stream_nll": MetricInfo(
            "NLL under a bounded cache", "nats",
            "mean over predicted tokens of -log p(x_{i+1} | the keys the cache holds when x_i is read)", SOURCE,
            "lower = the model reads the text better through this cache", per="model"),
        "stream_p0_mass": MetricInfo(
            "p0 mass through the cache", "share of real-key mass",
            "w_i0 = exp(s_i0 - LSE_i) on the key of document position 0, read through the condition's cache "
            "(quantised or not), averaged over every layer, head and query from position 1 on that sees it",
            SOURCE + "; SPEC.md Quantised KV caches",
            "does the sink survive the cache? far below the 16-bit row = quantisation moved attention off "
            "the first token", per="model"),
        "stream_quantised_share": MetricInfo(
            "share of the cache quantised", "share of cached keys and values",
            "after every chunk, the keys and values the cache holds in reduced precision over all it holds (a key "
            "and its value counted apart, every layer, key-value head and slot), pooled over the reading",
            "SPEC.md Quantised KV caches",
            "0 = the condition quantised nothing and its rows equal the 16-bit reading's; the rest of the cache "
            "(protected, kivi's residual window, keys waiting for a whole group) stays exact", per="model"),
        "stream_ppl": MetricInfo(
            "perplexity under a bounded cache", "", "exp(stream_nll)", SOURCE,
            "lower = better; window-only far above full = the model needs its sink tokens", per="model"),
    },
    params=(
        Param("policies", tuple, ("full", "window", "sinks", "h2o"), "reading policies", choices=POLICIES),
        Param("caches", tuple, (256,), "keys the cache holds when a token arrives (an exact bound at any chunk)", check=_positive),
        Param("sink_tokens", tuple, (4,), "first tokens kept by the sinks policy"),
        Param("positions", tuple, ("cache",), "position convention(s)", choices=POSITIONS),
        Param("chunk", int, 64, "tokens read per forward pass (evict after each)", check=lambda v: _positive((v,))),
        Param("mode", str, "stream", "stream (through the cache) | mask (one dense pass, the exact reference)",
              choices=("stream", "mask")),
        Param("h2o_recent", float, 0.5, "h2o: share of the budget for the most recent keys",
              check=lambda v: None if 0 < v < 1 else "must lie in (0, 1)"),
        Param("bucket", int, 256, "tokens per position bucket", check=lambda v: _positive((v,))),
        Param("length", int, 2048, "tokens per document (window)", check=lambda v: None if v >= 2 else "must be >= 2"),
        Param("n_windows", int, 1, "windows (documents) of the run", check=lambda v: _positive((v,))),
        Param("kv_bits", tuple, (16,), "bits of the cached keys and values (16 = not quantised)", check=_bits),
        Param("kv_group", tuple, (64,), "elements per quantisation group", check=_groups),
        Param("kv_scheme", tuple, ("kivi",), "quantisation group layout", choices=SCHEMES),
        Param("kv_residual", int, 0, "kivi's residual length: keys gathered in full precision, recent values kept "
              "exact (0 = the group size)", check=lambda v: None if v >= 0 else "must be >= 0"),
        Param("protect_sinks", tuple, (0,), "the document's first tokens kept in full precision", check=_counts),
        Param("protect", tuple, (), "keys kept in full precision by attention (top-p0:N) or at random (random:N)",
              check=_rules),
        Param("kv_backend", str, "sinkscope", "the quantiser: sinkscope's, or transformers' QuantizedCache where it can",
              choices=("sinkscope", "transformers")),
    ),
    summary="per-token NLL of a long text read through a bounded KV cache, per policy (StreamingLLM, H2O)",
)
class StreamNLL(Probe):
    """Per-token NLL per reading condition and window; rows per condition and position bucket."""

    #: this probe's windows are read by ``commands/stream.py``'s reader, not by ``runner.run_probes``.
    reads_windows = True

    def setup(self) -> None:
        self.caches = tuple(int(c) for c in self.caches)
        self.sink_tokens = tuple(int(n) for n in self.sink_tokens)
        self.kv_bits = tuple(int(b) for b in self.kv_bits)
        self.kv_group = tuple(int(g) for g in self.kv_group)
        self.protect_sinks = tuple(int(n) for n in self.protect_sinks)
        self.conditions = reading_conditions(self.policies, self.caches, self.sink_tokens, self.positions,
                                             self.h2o_recent, self.kv_bits, self.kv_group, tuple(self.kv_scheme),
                                             self.protect_sinks, tuple(self.protect), self.kv_backend,
                                             int(self.kv_residual))
        #: the run quantises: every row carries the quantisation's columns
        self.quantises = any(policy.quantised for policy in self.conditions)
        self.nll = torch.zeros(len(self.conditions), self.n_windows, self.length - 1)  # (C, N, L - 1) float32
        self.read = torch.zeros(len(self.conditions), self.n_windows)  # 1 where a window was read (merges by +)
        # the position-0 share through the cache (runs that quantise): sums and counts per condition and window
        self.p0_sum = torch.zeros(len(self.conditions), self.n_windows, dtype=torch.float64)
        self.p0_count = torch.zeros(len(self.conditions), self.n_windows, dtype=torch.float64)
        # the keys and values held in reduced precision (runs that quantise): sums over chunks per condition and window
        self.reduced_sum = torch.zeros(len(self.conditions), self.n_windows, dtype=torch.float64)
        self.held_sum = torch.zeros(len(self.conditions), self.n_windows, dtype=torch.float64)

    def add(self, condition: int, window: int, nll: Tensor) -> None:
        """Window ``window``'s per-token NLL (L - 1,) under condition ``condition``."""
        self.nll[condition, window] = nll.detach().float().cpu()
        self.read[condition, window] = 1.0

    def add_p0(self, condition: int, window: int, total: float, count: int) -> None:
        """Window ``window``'s position-0 share under ``condition``: its sum over queries, heads and layers, and their count."""
        self.p0_sum[condition, window] = total
        self.p0_count[condition, window] = count

    def add_quantised(self, condition: int, window: int, quantised: int, held: int) -> None:
        """Window ``window``'s reduced-precision count under ``condition``: the keys and values its cache held quantised
        after each chunk, and all it held, summed over chunks (``reader.QuantisedReading``)."""
        self.reduced_sum[condition, window] = quantised
        self.held_sum[condition, window] = held

    def per_token(self) -> Tensor:
        """(C, N, L - 1) float32: every condition's NLL per window and predicted position."""
        return self.nll

    def rows(self) -> list[Row]:
        rows: list[Row] = []
        positions = torch.arange(1, self.length)  # the predicted token's position
        buckets = torch.div(positions, self.bucket, rounding_mode="floor") * self.bucket  # (L - 1,)
        for c, policy in enumerate(self.conditions):
            done = self.read[c] > 0  # (N,)
            n_docs = int(done.sum())
            if not n_docs:
                continue
            nll = self.nll[c][done].double()  # (n, L - 1)
            per_doc = nll.mean(1)  # (n,)
            mean = float(per_doc.mean())
            se = float(per_doc.std(unbiased=True) / math.sqrt(n_docs)) if n_docs > 1 else math.nan
            conditions = (*policy.conditions(self.quantises), ("position_bucket", None))
            rows += [Row(self.name, "stream_nll", None, None, mean, n_docs, conditions, se),
                     Row(self.name, "stream_ppl", None, None, math.exp(mean), n_docs, conditions,
                         math.exp(mean) * se)]
            counted = self.p0_count[c] > 0  # (N,)
            if counted.any():
                per_window = self.p0_sum[c][counted] / self.p0_count[c][counted]  # (n,)
                share = float(self.p0_sum[c].sum() / self.p0_count[c].sum())
                spread = float(per_window.std(unbiased=True) / math.sqrt(per_window.numel())) if per_window.numel() > 1 \
                    else math.nan
                rows.append(Row(self.name, "stream_p0_mass", None, None, share, int(counted.sum()), conditions,
                                spread))
            if policy.quantised:
                rows += self._quantised_share_rows(c, conditions)
            for start in torch.unique(buckets).tolist():
                inside = buckets == start
                values = nll[:, inside]  # (n, b)
                bucket_mean = float(values.mean())
                bucket_se = float(values.mean(1).std(unbiased=True) / math.sqrt(n_docs)) if n_docs > 1 else math.nan
                at = (*policy.conditions(self.quantises), ("position_bucket", int(start)))
                rows += [Row(self.name, "stream_nll", None, None, bucket_mean, n_docs, at, bucket_se),
                         Row(self.name, "stream_ppl", None, None, math.exp(bucket_mean), n_docs, at,
                             math.exp(bucket_mean) * bucket_se)]
        return rows

    def _quantised_share_rows(self, c: int, conditions: tuple) -> list[Row]:
        """``stream_quantised_share``: the share of the keys and values the cache held in reduced precision,
        after every chunk, pooled over the reading (SPEC.md "Quantised KV caches"); ``se`` over documents.
        0 says the condition quantised nothing: its rows are the 16-bit reading's."""
        counted = self.held_sum[c] > 0  # (N,)
        if not counted.any():
            return []
        per_window = self.reduced_sum[c][counted] / self.held_sum[c][counted]  # (n,)
        share = float(self.reduced_sum[c].sum() / self.held_sum[c].sum())
        spread = float(per_window.std(unbiased=True) / math.sqrt(per_window.numel())) if per_window.numel() > 1 \
            else math.nan
        return [Row(self.name, "stream_quantised_share", None, None, share, int(counted.sum()), conditions, spread)]

    def arrays(self) -> dict:
        """``stream_nll``: (conditions, windows, L - 1) float32, every token's NLL (the manifest lists the conditions)."""
        return {"stream_nll": self.nll.numpy()}

    def options(self) -> dict:
        """The parameters, plus the reading conditions in the order of ``stream_nll.npy``'s first axis."""
        return {**super().options(), "conditions": [
            {"policy": p.name, "cache": p.cache, "sink_tokens": p.sink_tokens, "positions": p.positions,
             "recent": p.recent, "kv_bits": p.kv_bits, "kv_group": p.kv_group, "kv_scheme": p.kv_scheme,
             "kv_residual": p.kv_residual, "protect_sinks": p.protect_sinks, "protect": p.protect, "kv_backend": p.kv_backend,
             "label": p.label} for p in self.conditions]}
