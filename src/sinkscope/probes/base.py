"""What every probe is: a streaming reduction from records to rows of the results table.

A probe keeps accumulators of sums and counts shaped by (layer, head). ``observe_*`` adds one
batch; ``rows()`` finalises. Because accumulators only add, the numbers do not depend on the
batch size, and a run can later be checkpointed or merged across processes (``state_dict``).

Pooling convention (SPEC.md "Averages"): a per-head value is the mean over items (query
positions i >= 1 and sequences, unless the metric says otherwise); a per-layer value is the
mean over that layer's heads; a model value is the mean over layers. ``n`` counts the items
behind a number (summed over heads and layers for the aggregates).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import torch
from torch import Tensor

from sinkscope.capture.families import ModelSpec
from sinkscope.capture.record import AttentionRecord


@dataclass(frozen=True)
class MetricInfo:
    """What a metric means, for ``sinkscope ls``, the manifest and the report.

    Attributes:
        label: short human name (figure titles, table headers).
        unit: unit of the value (axis labels).
        formula: the definition in words and symbols (SPEC.md notation).
        source: where the definition comes from (SPEC.md section, paper).
        direction: how to read the value, e.g. "higher = more mass parked on position 0", or "".
        per: granularity of the finest rows: "layer x head", "layer x KV head", "layer" or "model".
    """

    label: str
    unit: str
    formula: str
    source: str
    direction: str = ""
    per: str = "layer x head"


@dataclass(frozen=True)
class Row:
    """One number of the tidy results table; ``None`` layer/head marks an aggregate."""

    probe: str
    metric: str
    layer: int | None
    head: int | None
    value: float
    n: int


class HeadMeans:
    """Float64 sums and counts per (layer, head), finalised into per-head means and aggregates."""

    def __init__(self, n_layers: int, n_heads: int):
        self.sums = torch.zeros(n_layers, n_heads, dtype=torch.float64)
        self.counts = torch.zeros(n_layers, n_heads, dtype=torch.int64)
        self.seen = torch.zeros(n_layers, dtype=torch.bool)

    def add(self, layer: int, per_item: Tensor, item_dims: tuple[int, ...]) -> None:
        """Add items of ``per_item`` (head axis 1) summed over ``item_dims``.

        Example: ``per_item`` (B, H, T) with ``item_dims=(0, 2)`` adds B*T items per head.
        """
        x = per_item.detach().to("cpu", torch.float64)
        self.sums[layer] += x.sum(dim=item_dims)  # (H,)
        count = 1
        for d in item_dims:
            count *= x.shape[d]
        self.counts[layer] += count
        self.seen[layer] = True

    def set(self, layer: int, values: Tensor) -> None:
        """Record one value per head (e.g. a learned parameter), n = 1."""
        self.sums[layer] = values.detach().to("cpu", torch.float64)
        self.counts[layer] = 1
        self.seen[layer] = True

    def rows(self, probe: str, metric: str, *, layers: list[int] | None = None) -> list[Row]:
        """Per-head rows, per-layer means over heads, one model mean over the layers seen."""
        out: list[Row] = []
        layer_values: list[float] = []
        total_n = 0
        for layer in range(self.sums.shape[0]):
            if not self.seen[layer] or (layers is not None and layer not in layers):
                continue
            means = self.sums[layer] / self.counts[layer].clamp(min=1)  # (H,)
            for head, value in enumerate(means.tolist()):
                out.append(Row(probe, metric, layer, head, value, int(self.counts[layer, head])))
            layer_n = int(self.counts[layer].sum())
            layer_values.append(float(means.mean()))
            out.append(Row(probe, metric, layer, None, layer_values[-1], layer_n))
            total_n += layer_n
        if layer_values:
            out.append(Row(probe, metric, None, None, sum(layer_values) / len(layer_values), total_n))
        return out

    def state_dict(self) -> dict[str, Tensor]:
        return {"sums": self.sums.clone(), "counts": self.counts.clone(), "seen": self.seen.clone()}

    def load_state_dict(self, state: dict[str, Tensor]) -> None:
        self.sums, self.counts, self.seen = state["sums"].clone(), state["counts"].clone(), state["seen"].clone()

    def merge(self, other: "HeadMeans") -> None:
        """Add another accumulator of the same shape (another process's share of the windows).

        Layers recorded with :meth:`set` (one value, n = 1) are taken, not added.
        """
        for layer in range(self.sums.shape[0]):
            if not other.seen[layer]:
                continue
            if self.seen[layer] and (self.counts[layer] == 1).all() and (other.counts[layer] == 1).all():
                continue  # a set() value (a parameter): identical in every share
            self.sums[layer] += other.sums[layer]
            self.counts[layer] += other.counts[layer]
            self.seen[layer] = True


class Probe:
    """Base class: declare ``name``, ``metrics``, ``needs_residual``; override the hooks."""

    name: ClassVar[str]
    #: the metrics this probe writes, documented (shown by ``sinkscope ls``, kept in the manifest).
    metrics: ClassVar[dict[str, MetricInfo]]
    #: whether the probe reads each decoder layer's output hidden state.
    needs_residual: ClassVar[bool] = False

    def __init__(self, spec: ModelSpec):
        self.spec = spec

    def observe_attention(self, record: AttentionRecord) -> None:
        """Reduce one layer's record of one batch into the accumulators."""

    def observe_residual(self, layer: int, hidden: Tensor) -> None:
        """Reduce one layer's output hidden state (B, T, C) into the accumulators."""

    def rows(self) -> list[Row]:
        """Finalise the accumulators into rows."""
        raise NotImplementedError

    def options(self) -> dict:
        """The probe's parameters, recorded in the manifest."""
        return {}

    # ---- accumulator state: checkpoints (resume), retries (OOM), merging (data parallel) ----
    def _accumulators(self) -> dict[str, "HeadMeans | Tensor"]:
        return {k: v for k, v in vars(self).items() if isinstance(v, (HeadMeans, Tensor))}

    def state_dict(self) -> dict:
        """A copy of every accumulator (small: per layer and head)."""
        return {k: v.state_dict() if isinstance(v, HeadMeans) else v.clone()
                for k, v in self._accumulators().items()}

    def load_state_dict(self, state: dict) -> None:
        for key, value in self._accumulators().items():
            if isinstance(value, HeadMeans):
                value.load_state_dict(state[key])
            else:
                setattr(self, key, state[key].clone())

    def merge(self, other: "Probe") -> None:
        """Fold in another probe's accumulators (same class, same spec), as if it had seen its
        windows after this one's. Probes with non-additive state override this."""
        for key, value in self._accumulators().items():
            theirs = getattr(other, key)
            if isinstance(value, HeadMeans):
                value.merge(theirs)
            else:
                setattr(self, key, value + theirs)
