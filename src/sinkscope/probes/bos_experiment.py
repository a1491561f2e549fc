"""Sink_0^eps with and without BOS, and the loss when the first token is repeated (SPEC.md "The
position-zero circuit"; the P0-sink study, Table 1).

One of the position-zero circuit's probes, which ``sinkscope circuit`` runs together
(``commands/circuit.py``). It reads only named hook points (``capture/hooks.py``), so it runs on
every Hugging Face family and on the trainer's own model alike.

``bos_experiment``: passes with their own inputs (``Probe.pass_inputs``). From each window take
the content ``K = window[1 : T - r_max + 1]`` (the window without its first token, which is the
BOS where the run adds one; short enough that the longest pass fits in T tokens), L = T - r_max
tokens. Passes, for each r in ``repeats`` (1, 2, 4, 8):

    with BOS     [BOS] * r + K                  (the P0-sink study: in the w/ [BOS] setting BOS is repeated)
    without BOS  [K_0] * r + K[1:]              (the first content token repeated)

The loss is the mean next-token cross-entropy over the targets K[1:] only (L - 1 per window, the
same tokens in every pass): predictions of the repeated copies and the prediction made at the
BOS position are excluded. ``bos_repeat_loss_delta`` = loss(r) - loss(r = 1) of the same
setting. ``Sink_0^eps`` per layer (and per head) comes from the r = 1 passes: the fraction of
heads whose alpha_0 = mean over queries of a_t0 exceeds eps (probes/sink_rate.py), so "with" is
``[BOS] + K`` and "without" is ``K``. Without a BOS id (a tokenizer with none) only the
"without" setting runs.
"""

from __future__ import annotations

import torch
from torch import Tensor

from sinkscope.capture import hooks
from sinkscope.capture.record import AttentionRecord
from sinkscope.errors import SinkscopeError
from sinkscope.errors import check_repeats
from sinkscope.probes.base import HeadMeans, LazyTensors, Param, observes, register_probe
from sinkscope.store.results import MetricInfo, Row
from sinkscope.probes.sink_rate import key_importance


@register_probe(
    "bos_experiment",
    params=(
        Param("bos_id", int, None, "the BOS token id (None: only the without-BOS setting)", optional=True),
        Param("repeats", tuple, (1, 2, 4, 8), "how many times the first token is repeated", check=check_repeats),
        Param("epsilon", float, 0.3, "Gu et al.'s threshold eps on alpha_0",
              check=lambda v: None if 0.0 < v < 1.0 else "must lie in (0, 1)"),
        Param("layer_start", int, 2, "first layer of the bos_sink_rate_from_layer row (None: no such row)",
              check=lambda v: None if v >= 0 else "must be at least 0", optional=True),
    ),
    metrics={
        "bos_sink_rate": MetricInfo(
            "Sink rate with / without BOS", "fraction of heads",
            "Sink_0^eps on [BOS] + K (bos = with) and on K (bos = without), K the window's content; per head the "
            "fraction of windows in which alpha_0 > eps", "SPEC.md 'The position-zero circuit'; the P0-sink study, Table 1(a)",
            "higher = more heads sink on position 0"),
        "bos_sink_rate_from_layer": MetricInfo(
            "Sink rate with / without BOS, from a layer on", "fraction of heads",
            "bos_sink_rate restricted to layers l >= s, s in the layer_start column (default 2)",
            "the P0-sink study, Table 1(a) (Sink_0^eps[2:])", "", per="model"),
        "bos_repeat_loss": MetricInfo(
            "Loss with the first token repeated", "nats / token",
            "mean next-token cross-entropy over the targets K[1:] only, with [BOS] x r + K (with) or K_0 x r + K[1:] "
            "(without); repeat column = r; n = the windows; no se (only the loss summed over every prediction is "
            "kept)", "the P0-sink study, Table 1(b)", "", per="model"),
        "bos_repeat_loss_delta": MetricInfo(
            "Loss change from repeating the first token", "nats / token",
            "bos_repeat_loss(r) - bos_repeat_loss(1); no se (no per-window loss is kept)",
            "the P0-sink study, Table 1(b)", "smaller = position 0 a more stable 'semantic vacuum'", per="model"),
    },
)
class BosExperiment(LazyTensors):
    """Sink_0^eps with and without BOS, and the loss when the first token is repeated r times."""

    bos_id: int | None
    repeats: tuple
    epsilon: float
    layer_start: int | None

    def setup(self) -> None:
        self.r = sorted({int(r) for r in self.repeats})
        self.settings = (["with"] if self.bos_id is not None else []) + ["without"]
        self.labels = [f"{s}-bos-r{r}" for s in self.settings for r in self.r]
        self.loss_sum = torch.zeros(len(self.labels), dtype=torch.float64)
        self.loss_n = torch.zeros(len(self.labels), dtype=torch.float64)
        self.loss_windows = torch.zeros(len(self.labels), dtype=torch.int64)  # the rows' n (on the CPU: shapes only)
        self.hits = {s: HeadMeans(self.spec.n_layers, self.spec.n_heads) for s in self.settings}

    def _accumulators(self) -> dict:
        """Declared here (this class loads, rolls back and merges them itself), keyed as ever: hits_with, ..."""
        return {"loss_sum": self.loss_sum, "loss_n": self.loss_n, "loss_windows": self.loss_windows,
                **{f"hits_{s}": acc for s, acc in self.hits.items()}}

    def load_state_dict(self, state: dict) -> None:
        for s, acc in self.hits.items():
            acc.load_state_dict(state[f"hits_{s}"])
        self.loss_sum, self.loss_n = state["loss_sum"].clone(), state["loss_n"].clone()
        self.loss_windows = state["loss_windows"].clone()

    def snapshot(self) -> dict:
        return {"loss_sum": self.loss_sum.clone(), "loss_n": self.loss_n.clone(),
                "loss_windows": self.loss_windows.clone(), "hits": {s: a.snapshot() for s, a in self.hits.items()}}

    def restore(self, snapshot: dict) -> None:
        self.loss_sum, self.loss_n, self.hits = snapshot["loss_sum"], snapshot["loss_n"], snapshot["hits"]
        self.loss_windows = snapshot["loss_windows"]

    def merge(self, other: "BosExperiment") -> None:
        for s, acc in self.hits.items():
            acc.merge(other.hits[s])
        self.loss_sum = self.loss_sum + other.loss_sum.to(self.loss_sum.device)
        self.loss_n = self.loss_n + other.loss_n.to(self.loss_n.device)
        self.loss_windows = self.loss_windows + other.loss_windows

    def passes(self) -> tuple[str | None, ...]:
        return tuple(self.labels)

    def _parse(self, label: str | None = None) -> tuple[str, int]:
        setting, _, r = (self.pass_label if label is None else label).partition("-bos-r")
        return setting, int(r)

    def pass_observers(self, label: str | None) -> dict[str, str]:
        """The r > 1 passes read only the loss: no attention record is built on them (issue 28)."""
        if label is not None and self._parse(label)[1] != 1:
            return {t: m for t, m in self.observers.items() if t != hooks.ATTN}
        return self.observers

    def content(self, ids: Tensor) -> Tensor:
        """K = window[1 : T - r_max + 1] (B, L)."""
        T = ids.shape[1]
        L = T - max(self.r)
        if L < 2:
            raise SinkscopeError(f"the BOS experiment needs seq_len >= {max(self.r) + 2} for repeats up to "
                                 f"{max(self.r)} (got {T}).")
        return ids[:, 1:1 + L]

    def pass_inputs(self, ids: Tensor) -> Tensor | None:
        if self.pass_label is None:
            return None
        setting, r = self._parse()
        K = self.content(ids)  # (B, L)
        B = K.shape[0]
        if setting == "with":
            first = torch.full((B, r), self.bos_id, dtype=ids.dtype, device=ids.device)
            return torch.cat([first, K], dim=1)  # (B, r + L)
        return torch.cat([K[:, :1].expand(B, r), K[:, 1:]], dim=1)  # (B, r + L - 1)

    @observes(hooks.LOSS)
    def loss(self, layer: None, value: Tensor) -> None:  # (B, T' - 1)
        setting, r = self._parse()
        start = r if setting == "with" else r - 1  # the prediction of K[1]
        kept = value[:, start:]  # (B, L - 1): the targets K[1:]
        index = self.labels.index(self.pass_label)
        if self.loss_sum.device != value.device:
            self.loss_sum, self.loss_n = self.loss_sum.to(value.device), self.loss_n.to(value.device)
        self.loss_sum[index] += kept.double().sum()
        self.loss_n[index] += kept.numel()
        self.loss_windows[index] += kept.shape[0]

    @observes(hooks.ATTN)
    def attention(self, layer: int, record: AttentionRecord) -> None:
        setting, r = self._parse()
        if r != 1:
            return
        alpha = key_importance(record, 0)  # (B, H): alpha_0 over queries t >= 0
        self.hits[setting].add(layer, (alpha > self.epsilon).float(), item_dims=(0,))

    def rows(self) -> list[Row]:
        rows: list[Row] = []
        for setting in self.settings:
            cond = (("bos", setting),)
            rows += [Row(r.probe, r.metric, r.layer, r.head, r.value, r.n, cond, se=r.se)
                     for r in self.hits[setting].rows(self.name, "bos_sink_rate")]
            if self.layer_start is not None:
                late = [l for l in self.spec.attention_layers if l >= self.layer_start]
                start = cond + (("layer_start", self.layer_start),)
                rows += [Row(self.name, "bos_sink_rate_from_layer", None, None, r.value, r.n, start, se=r.se)
                         for r in self.hits[setting].rows(self.name, "bos_sink_rate", layers=late) if r.layer is None]
        sums, counts = self.loss_sum.cpu(), self.loss_n.cpu()
        for setting in self.settings:
            base = self.labels.index(f"{setting}-bos-r1")
            for r in self.r:
                i = self.labels.index(f"{setting}-bos-r{r}")
                if counts[i] == 0:
                    continue
                n = int(self.loss_windows[i])  # the windows (SPEC.md "Tables"); no se: only sums are kept
                value = float(sums[i] / counts[i])
                cond = (("bos", setting), ("repeat", r))
                rows += [Row(self.name, "bos_repeat_loss", None, None, value, n, cond),
                         Row(self.name, "bos_repeat_loss_delta", None, None,
                             value - float(sums[base] / counts[base]), n, cond)]
        return rows
