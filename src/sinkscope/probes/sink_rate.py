"""Sink rate (Gu et al. 2025, "When attention sink emerges"; used in the P0-sink study, Table 1).

Per head and sequence the importance of key k is

    alpha_k = mean over queries t >= k of a_tk

(a_tk with the phantom, if any, in the normaliser; on a sliding-window layer queries that
cannot see key k contribute 0). ``Sink_k^eps`` is the fraction of (layer, head) pairs with
alpha_k > eps. We evaluate it per sequence and average over sequences, so the per-head row is
the fraction of sequences in which that head is a sink, the layer row the mean over heads, and
the model row the mean over layers = Sink_k^eps averaged over sequences. ``sink_rate_from_layer``
restricts the model mean to layers l >= s, s in its ``layer_start`` column (the P0-sink study's
``Sink_0^eps[2:]`` is s = 2; a parameter is a column, never part of a metric's name). ``sink_alpha`` is alpha_k
itself, averaged over sequences. Defaults: k = 0, eps = 0.3.

On a sliding-window layer of window W, queries t >= k + W cannot see key k, so alpha_k mixes the
head's behaviour with the share of queries out of reach (a head that sinks every query it can
reach still falls below eps at long contexts). Those layers also get, as ``p0_mass_in_reach``
beside ``p0_mass``:

    alpha_k^reach = sum over queries t that see key k of a_tk / their number
    sink_rate_in_reach, sink_alpha_in_reach   the same thresholding and means on alpha_k^reach

with per-head and per-layer rows for the sliding layers and a model row averaged over them.
"""

from __future__ import annotations

import torch

from sinkscope.capture import hooks
from sinkscope.capture.record import AttentionRecord
from sinkscope.probes.base import HeadMeans, Param, Probe, observes, register_probe
from sinkscope.store.results import MetricInfo, Row


def key_importance(record: AttentionRecord, k: int = 0, first_query: int | None = None) -> torch.Tensor:
    """alpha_k = mean over queries t >= max(k, first_query) of a_tk (phantom, if any, in the normaliser), (B, H).

    Gu et al.'s importance of key k (``first_query`` None: every query t >= k); ``sink_rate`` and
    circuit's ``bos_sink_rate`` threshold it.
    """
    first = k if first_query is None else max(k, first_query)
    return record.key_mass(k, over="all")[:, :, first:].mean(dim=-1)  # (B, H, T - first) -> (B, H)


def key_importance_in_reach(record: AttentionRecord, k: int = 0, first_query: int | None = None) -> torch.Tensor:
    """alpha_k^reach = mean of a_tk over the queries t >= first_query that can see key k (not masked), (B, H)."""
    visible = record.key_visible(k).to(torch.float32)  # (B, H, T); t < k are masked
    if first_query:
        visible[:, :, :first_query] = 0.0
    mass = record.key_mass(k, over="all")  # (B, H, T)
    return (mass * visible).sum(dim=-1) / visible.sum(dim=-1).clamp(min=1.0)  # (B, H)


@register_probe(
    "sink_rate",
    params=(
        Param("epsilon", float, 0.3, "Gu et al.'s threshold eps on alpha_k",
              check=lambda v: None if 0.0 < v < 1.0 else "must lie in (0, 1)"),
        Param("key", int, 0, "the key position k whose importance alpha_k is thresholded",
              check=lambda v: None if v >= 0 else "must be at least 0"),
        Param("layer_start", int, 2, "first layer of the sink_rate_from_layer row (None: no such row)",
              check=lambda v: None if v >= 0 else "must be at least 0", optional=True),
        Param("first_query", int, None, "alpha_k averages the queries t >= max(k, this) (None: t >= k, Gu et al.'s; "
              "1: the queries after the first, a third-party audit's); a first_query column when set",
              check=lambda v: None if v >= 0 else "must be at least 0", optional=True),
    ),
    metrics={
        "sink_rate": MetricInfo(
            "Sink rate", "fraction of heads",
            "Sink_k^eps: share of (layer, head) pairs whose importance alpha_k = mean over queries t >= k of "
            "a_tk exceeds eps (k = 0, eps = 0.3), evaluated per window and averaged over windows; per head "
            "it is the fraction of windows in which the head is a sink",
            "SPEC.md 'Sink rate'; Gu et al. 2025; the P0-sink study, Table 1",
            "higher = more heads act as sinks"),
        "sink_rate_from_layer": MetricInfo(
            "Sink rate from a layer on", "fraction of heads",
            "Sink_0^eps restricted to layers l >= s, s in the layer_start column (--sink-layer-start; default 2)",
            "SPEC.md 'Sink rate'; the P0-sink study, Table 1 (Sink_0^eps[2:])",
            "higher = more heads act as sinks", per="model"),
        "sink_alpha": MetricInfo(
            "Key-0 importance", "mean attention on key 0",
            "alpha_0 = mean over queries t >= 0 of a_t0 (phantom, if any, in the normaliser), averaged over windows",
            "Gu et al. 2025 (importance score behind the sink rate)",
            "higher = key 0 receives more attention"),
        "sink_rate_in_reach": MetricInfo(
            "Sink rate, queries in reach", "fraction of heads",
            "sink_rate with alpha_0 averaged over the queries that can see key 0 only (sliding-window layers only; "
            "the model row averages those layers)",
            "Gu et al. 2025; the learned-sinks note (sliding windows)",
            "higher = more heads sink the queries that can reach key 0"),
        "sink_alpha_in_reach": MetricInfo(
            "Key-0 importance, queries in reach", "mean attention on key 0",
            "mean of a_t0 over the queries t that can see key 0 (sliding-window layers only), averaged over windows",
            "Gu et al. 2025; the learned-sinks note (sliding windows)",
            "higher = key 0 receives more attention from the queries that can see it"),
    },
)
class SinkRate(Probe):
    """Gu et al.'s sink rate: the share of heads whose key-0 importance exceeds eps."""

    reads_weights_only = True  # the eager fallback's records (weights, no q/k/v) suffice

    epsilon: float
    key: int
    layer_start: int | None
    first_query: int | None

    def setup(self) -> None:
        self.hits = HeadMeans(self.spec.n_layers, self.spec.n_heads)
        self.alpha = HeadMeans(self.spec.n_layers, self.spec.n_heads)
        self.hits_in_reach = HeadMeans(self.spec.n_layers, self.spec.n_heads)  # sliding layers only
        self.alpha_in_reach = HeadMeans(self.spec.n_layers, self.spec.n_heads)

    @observes(hooks.ATTN)
    def attention(self, layer: int, record: AttentionRecord) -> None:
        alpha = key_importance(record, self.key, self.first_query)  # (B, H)
        self.alpha.add(layer, alpha, item_dims=(0,))
        self.hits.add(layer, (alpha > self.epsilon).float(), item_dims=(0,))
        if record.sliding_window is not None:
            reach = key_importance_in_reach(record, self.key, self.first_query)  # (B, H)
            self.alpha_in_reach.add(layer, reach, item_dims=(0,))
            self.hits_in_reach.add(layer, (reach > self.epsilon).float(), item_dims=(0,))

    def rows(self) -> list[Row]:
        rows = self._rows()
        if self.first_query is None:
            return rows
        column = (("first_query", self.first_query),)
        return [Row(r.probe, r.metric, r.layer, r.head, r.value, r.n, tuple(r.conditions or ()) + column, se=r.se)
                for r in rows]

    def _rows(self) -> list[Row]:
        rows = self.hits.rows(self.name, "sink_rate") + self.alpha.rows(self.name, "sink_alpha")
        rows += (self.hits_in_reach.rows(self.name, "sink_rate_in_reach")
                 + self.alpha_in_reach.rows(self.name, "sink_alpha_in_reach"))  # empty without sliding layers
        if self.layer_start is None:
            return rows
        late = [r for r in self.hits.rows(self.name, "sink_rate",
                                           layers=[l for l in self.spec.attention_layers if l >= self.layer_start])
                if r.layer is None]
        start = (("layer_start", self.layer_start),)
        rows += [Row(self.name, "sink_rate_from_layer", None, None, r.value, r.n, start, se=r.se) for r in late]
        return rows
