"""Sink rate (Gu et al. 2025, "When attention sink emerges"; used in seed 003 Table 1).

Per head and sequence the importance of key k is

    alpha_k = mean over queries t >= k of a_tk

(a_tk with the phantom, if any, in the normaliser; on a sliding-window layer queries that
cannot see key k contribute 0). ``Sink_k^eps`` is the fraction of (layer, head) pairs with
alpha_k > eps. We evaluate it per sequence and average over sequences, so the per-head row is
the fraction of sequences in which that head is a sink, the layer row the mean over heads, and
the model row the mean over layers = Sink_k^eps averaged over sequences. ``sink_rate[s:]``
restricts the model mean to layers l >= s (seed 003 uses s = 2). ``sink_alpha`` is alpha_k
itself, averaged over sequences. Defaults: k = 0, eps = 0.3.
"""

from __future__ import annotations

from sinkscope.capture.record import AttentionRecord
from sinkscope.probes.base import HeadMeans, MetricInfo, Probe, Row


class SinkRate(Probe):
    name = "sink_rate"
    metrics = {
        "sink_rate": MetricInfo(
            "Sink rate", "fraction of heads",
            "Sink_k^eps: share of (layer, head) pairs whose importance alpha_k = mean over queries t >= k of "
            "a_tk exceeds eps (k = 0, eps = 0.3), evaluated per window and averaged over windows; per head "
            "it is the fraction of windows in which the head is a sink",
            "SPEC.md 'Sink rate'; Gu et al. 2025; seed 003 Table 1",
            "higher = more heads act as sinks"),
        "sink_rate[2:]": MetricInfo(
            "Sink rate, layers 2 on", "fraction of heads",
            "Sink_0^eps restricted to layers l >= 2 (the start is --sink-layer-start)",
            "SPEC.md 'Sink rate'; seed 003 Table 1 (Sink_0^eps[2:])",
            "higher = more heads act as sinks", per="model"),
        "sink_alpha": MetricInfo(
            "Key-0 importance", "mean attention on key 0",
            "alpha_0 = mean over queries t >= 0 of a_t0 (phantom, if any, in the normaliser), averaged over windows",
            "Gu et al. 2025 (importance score behind the sink rate)",
            "higher = key 0 receives more attention"),
    }

    def __init__(self, spec, *, epsilon: float = 0.3, key: int = 0, layer_start: int = 2):
        super().__init__(spec)
        self.epsilon, self.key, self.layer_start = epsilon, key, layer_start
        self.hits = HeadMeans(spec.n_layers, spec.n_heads)
        self.alpha = HeadMeans(spec.n_layers, spec.n_heads)

    def observe_attention(self, record: AttentionRecord) -> None:
        k = self.key
        column = record.key_mass(k, over="all")[:, :, k:]  # (B, H, T - k): a_tk for t >= k
        alpha = column.mean(dim=-1)  # (B, H)
        self.alpha.add(record.layer, alpha, item_dims=(0,))
        self.hits.add(record.layer, (alpha > self.epsilon).float(), item_dims=(0,))

    def rows(self) -> list[Row]:
        rows = self.hits.rows(self.name, "sink_rate") + self.alpha.rows(self.name, "sink_alpha")
        late = [r for r in self.hits.rows(self.name, "sink_rate",
                                           layers=[l for l in self.spec.attention_layers if l >= self.layer_start])
                if r.layer is None]
        rows += [Row(self.name, f"sink_rate[{self.layer_start}:]", None, None, r.value, r.n) for r in late]
        return rows

    def options(self) -> dict:
        return {"epsilon": self.epsilon, "key": self.key, "layer_start": self.layer_start}
