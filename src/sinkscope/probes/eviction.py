"""Eviction on sliding-window layers (the learned-sinks note): how much a head's output moves when a key leaves.

On a layer with window W, query i sees keys i-W+1 .. i; between query i and query i+1 the key
e = i-W+1 leaves the window. Holding the query fixed, removing e from query i's support
renormalises the other weights (the phantom, where there is one, stays in the normaliser):

    a'_ij = a_ij / (1 - a_ie)   (j != e),     o'_i = (o_i - a_ie v_e) / (1 - a_ie)
    delta_i = o'_i - o_i = a_ie (o_i - v_e) / (1 - a_ie)

with a_ij the row weights with the phantom in the normaliser (SPEC.md), o_i = sum_j a_ij v_j the
head's output before any output gate, v_j the value read (g_j v_j under a value gate). Per
(layer, head), averaged over every eviction (queries i with a full window whose oldest key is
hidden from query i+1) and window:

    eviction_mass          a_ie: the share of the row's mass on the key about to leave
    eviction_shift         ||delta_i||
    eviction_shift_rel     ||delta_i|| / ||o_i||
    eviction_anchor_shift_rel  ||delta_i|| / ||o_i|| when the key leaving is key 0 (query W-1):
                           the anchor of StreamingLLM (the learned-sinks note "rips out the anchor")

A model that parks mass on a learned phantom (gpt-oss, the trainer's ``sink*`` variants) can
let eviction reclaim it silently; one that parks it on key 0 loses it when key 0 leaves. Full
layers, and sliding layers whose window covers the whole sequence, give no rows. A key that
stays visible (the trainer's ``sinktoken`` keeps its sink token) is not an eviction.

Cost: on the fused path the rows are walked in blocks of at most :data:`BLOCK_BYTES` of weights
(no (T, S) matrix, issue 42); ``--attention explicit`` reads the model's own (B, H, T, S) weights.
"""

from __future__ import annotations

import torch

from sinkscope.capture import hooks
from sinkscope.capture.record import MASKED_BELOW, AttentionRecord
from sinkscope.probes.base import HeadMeans, Probe, observes, register_probe
from sinkscope.store.results import MetricInfo, Row

_SOURCE = "the learned-sinks note (eviction in sliding windows); sinkscope.probes.eviction"
#: the most float32 weights one query block of the fused path holds (bytes).
BLOCK_BYTES = 64 << 20


@register_probe("eviction", metrics={
    "eviction_mass": MetricInfo(
        "Mass on the key leaving the window", "share of row mass",
        "a_ie, e = i-W+1: the weight (phantom in the normaliser) of the oldest key of a full window, the one "
        "hidden from query i+1; mean over evictions (sliding layers only)", _SOURCE,
        "higher = eviction removes more of what the head reads"),
    "eviction_shift": MetricInfo(
        "Output shift at eviction", "norm of the head output",
        "||delta_i||, delta_i = a_ie (o_i - v_e) / (1 - a_ie): the change of the head's output o_i when key e "
        "leaves its support (weights renormalised, phantom kept); mean over evictions", _SOURCE,
        "higher = eviction moves the head's output more"),
    "eviction_shift_rel": MetricInfo(
        "Relative output shift at eviction", "ratio",
        "||delta_i|| / ||o_i||; mean over evictions", _SOURCE,
        "higher = eviction moves the head's output more, relative to its size"),
    "eviction_anchor_shift_rel": MetricInfo(
        "Relative output shift when key 0 leaves", "ratio",
        "||delta_i|| / ||o_i|| at the query W-1, after which key 0 is out of the window", _SOURCE,
        "higher = the head leans on the first token as an anchor"),
})
class Eviction(Probe):
    """Change of each windowed head's output when its oldest key leaves the window."""

    @classmethod
    def unmeasurable(cls, spec, windows, seq_len):
        sliding = [w for layer, w in enumerate(windows) if w is not None and layer in spec.attention_layers]
        if not sliding:
            return "the model has no sliding-window layers, so no key is ever evicted"
        if seq_len is not None and all(w + 1 > seq_len or w < 2 for w in sliding):
            return (f"every sliding window ({', '.join(map(str, sorted(set(sliding))))}) covers the whole "
                    f"{seq_len}-token window, so no key leaves it; use a --seq-len above {min(sliding) + 1}")
        return None

    def setup(self) -> None:
        L, H = self.spec.n_layers, self.spec.n_heads
        self.events = HeadMeans(L, H)  # 1 where a key leaves, per query
        self.anchor_events = HeadMeans(L, H)
        self.mass = HeadMeans(L, H)  # sums of x * event, over the same items
        self.shift = HeadMeans(L, H)
        self.rel = HeadMeans(L, H)
        self.anchor = HeadMeans(L, H)

    @observes(hooks.ATTN)
    def attention(self, layer: int, record: AttentionRecord) -> None:
        W = record.sliding_window
        T, S = record.query.shape[-2], record.key.shape[-2]
        offset = S - T  # absolute position of query i is i + offset
        if W is None or W < 2 or W + 1 > S:  # no query has a full window and a next query
            return
        start = max(W - 1 - offset, 0)
        rows = torch.arange(start, T - 1, device=record.query.device)  # queries with a next one, (N,)
        if rows.numel() == 0:
            return
        keys = rows + offset - W + 1  # the oldest key of each full window, (N,)
        v = record.value.float()  # (B, Hkv, S, D)
        if record.value_gate is not None and not record.routing_gate:
            v = v * record.value_gate.float().unsqueeze(-1)  # g_j v_j
        v = v.repeat_interleave(record.n_heads // record.n_kv_heads, dim=1)  # (B, H, S, D)
        if record.is_fused:
            a_e, o, next_logit = self._fused_rows(record, start, keys, v)
        else:
            a_e, o, next_logit = self._explicit_rows(record, rows, keys, v)
        B, H = a_e.shape[:2]
        v_e = v[:, :, keys]  # (B, H, N, D)
        # a key leaves iff query i+1 cannot see it (the window's mask, not an assumption about it)
        event = (next_logit <= MASKED_BELOW).float()  # (B, H, N)
        delta = (a_e / (1 - a_e).clamp(min=1e-12)).unsqueeze(-1) * (o - v_e)  # (B, H, N, D)
        shift = delta.norm(dim=-1)  # (B, H, N)
        rel = shift / o.norm(dim=-1).clamp(min=1e-12)  # (B, H, N)
        self.events.add(layer, event, item_dims=(0, 2))
        self.mass.add(layer, a_e * event, item_dims=(0, 2))
        self.shift.add(layer, shift * event, item_dims=(0, 2))
        self.rel.add(layer, rel * event, item_dims=(0, 2))
        anchor = (keys == 0).float().view(1, 1, -1) * event  # (B, H, N)
        self.anchor_events.add(layer, anchor, item_dims=(0, 2))
        self.anchor.add(layer, rel * anchor, item_dims=(0, 2))

    @staticmethod
    def _explicit_rows(record: AttentionRecord, rows: torch.Tensor, keys: torch.Tensor,
                       v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """From the model's weights: a_ie, o_i (B, H, N, D) and s_{i+1, e}, for the N queries ``rows``."""
        a = record.weights.float()  # (B, H, T, S)
        B, H = a.shape[:2]
        index = keys.view(1, 1, -1, 1).expand(B, H, -1, 1)
        a_e = a[:, :, rows].gather(-1, index).squeeze(-1)  # (B, H, N)
        o = torch.matmul(a[:, :, rows], v)  # (B, H, N, D)
        next_logit = record.logits()[:, :, rows + 1].gather(-1, index).squeeze(-1)  # (B, H, N)
        return a_e, o, next_logit

    @staticmethod
    def _fused_rows(record: AttentionRecord, start: int, keys: torch.Tensor,
                    v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """The same from the kernel's LSE, one block of queries at a time: no (T, S) matrix (issue 42).

        a_ij = exp(s_ij - LSE_i) (1 - phi_i) for a block of rows (B, H, n, S); query i + 1's logit at
        key e from the next block's first row where it is not in this one.
        """
        T, S = record.query.shape[-2], record.key.shape[-2]
        B, H = record.query.shape[:2]
        lse, real = record.lse(), record.real_mass()  # (B, H, T) each
        step = max(1, BLOCK_BYTES // (4 * B * H * S))  # queries per block
        a_es, outs, nexts = [], [], []
        for first in range(start, T - 1, step):
            last = min(first + step, T - 1)  # rows first .. last - 1, and their next queries up to last
            logits = record.row_logits(slice(first, last + 1))  # (B, H, n + 1, S)
            n = last - first
            a = torch.exp(logits[:, :, :n] - lse[:, :, first:last].unsqueeze(-1)) * real[:, :, first:last].unsqueeze(-1)
            index = keys[first - start:last - start].view(1, 1, -1, 1).expand(B, H, -1, 1)  # (B, H, n, 1)
            a_es.append(a.gather(-1, index).squeeze(-1))  # (B, H, n)
            outs.append(torch.matmul(a, v))  # (B, H, n, D)
            nexts.append(logits[:, :, 1:].gather(-1, index).squeeze(-1))  # (B, H, n): query i + 1 at key e
        return torch.cat(a_es, dim=2), torch.cat(outs, dim=2), torch.cat(nexts, dim=2)

    def rows(self) -> list[Row]:
        out: list[Row] = []
        for metric, acc, events in (("eviction_mass", self.mass, self.events),
                                    ("eviction_shift", self.shift, self.events),
                                    ("eviction_shift_rel", self.rel, self.events),
                                    ("eviction_anchor_shift_rel", self.anchor, self.anchor_events)):
            out += _ratio_rows(self.name, metric, acc, events)
        return out


def _ratio_rows(probe: str, metric: str, sums: HeadMeans, events: HeadMeans) -> list[Row]:
    """Per head sum(x * event) / sum(event); per-layer means over heads; the model mean over layers.

    Both accumulators saw the same items, so the ratio of their means is the mean over events;
    ``n`` counts the events (the unit of the mean; SPEC.md "Tables"), and no row has an ``se`` (a ratio of
    two means over windows). Layers without an event give no rows.
    """
    x, e = sums.means(), events.means()  # (L, H)
    rows, layer_values, total = [], [], 0
    for layer in range(sums.n_layers):
        if not events.seen[layer]:
            continue
        counts = [int(round(float(c) * float(f))) for c, f in zip(events.counts[layer], e[layer])]
        if sum(counts) == 0:
            continue
        values = [float(x[layer, h] / e[layer, h]) if counts[h] else float("nan") for h in range(sums.n_heads)]
        for head, value in enumerate(values):
            rows.append(Row(probe, metric, layer, head, value, counts[head]))
        layer_values.append(float(torch.tensor(values, dtype=torch.float64).nanmean()))
        rows.append(Row(probe, metric, layer, None, layer_values[-1], sum(counts)))
        total += sum(counts)
    if layer_values:
        rows.append(Row(probe, metric, None, None, sum(layer_values) / len(layer_values), total))
    return rows
