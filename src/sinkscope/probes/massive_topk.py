"""Massive activations as Sun et al. (2024) measure them, and the intervention on them.

``massive_topk`` (SPEC.md "Massive activations"): per layer l (the output hidden state h of
decoder layer l, ``hook_resid_post``), the ``top_k`` largest entries |h[b, t, c]| over every
window, *distinct by (position, channel)*: an entry seen in several windows (position 0 holds the
same state in every window that starts with BOS) counts once, with its largest |h| and the token
of the window where that largest value was (the earliest window on a tie). Each row carries
``rank`` (1 = largest), ``channel``, ``position``, ``token_id`` (decoded to ``token``), ``signed``
(h itself) and ``massive``: 1 when the entry meets Sun et al.'s criterion in that window,

    |h| > min_abs (100)  and  |h| >= min_ratio (1,000) x median |h| of that window's hidden state

(the exact median over the window's T x C entries). ``massive_count`` is, per layer, the mean
number of entries per window meeting it. Exact and streaming: the distinct top k of the run is
among the union of each window's top k, so each batch folds its windows' top k into a k-long
buffer (deduplicated by (position, channel), largest kept); everything stays on the device.

With ``means`` (asked for by ``sinks --massive-intervention mean``) the probe also sums h over
windows at every (layer, position, channel), (L, T, C) float64, so the second stage can set an
entry to its mean over the run: memory L T C x 8 bytes (SmolLM2-135M-Instruct at 512 tokens: 71 MB).

``massive_intervention``: the second stage of ``sinkscope sinks --massive-intervention
zero|mean`` (``commands/sinks.py``). ``entries`` lists ``LAYER:POSITION:CHANNEL=VALUE``; the
changed pass sets h[:, POSITION, CHANNEL] at the output of LAYER to VALUE (0, or the entry's mean
over the run) through the intervention seam ``blocks.{l}.hook_resid_post``, so every later block
reads the replaced stream. As that second stage its clean loss is the first stage's (``clean_sum``,
``clean_n``, summed by ``massive_topk`` with ``clean_loss``), so only the changed pass runs;
alone (``sinkscope measure``) it runs its own clean pass too (``probes/loss_change.py``). Rows:
``massive_loss_clean``, ``massive_loss_intervened``, ``massive_loss_delta`` (intervened - clean,
nats per token at every position, as ``head_ablation``), the perplexities exp(loss) and
``massive_entries`` (how many entries were set).
"""

from __future__ import annotations

import math
import re

import torch
from torch import Tensor

from sinkscope.capture import hooks
from sinkscope.errors import SinkscopeError
from sinkscope.probes.base import Param, Probe, intervenes, non_negative, observes, register_probe
from sinkscope.store.results import MetricInfo, Row
from sinkscope.probes.loss_change import CLEAN_LOSS_PARAM, CLEAN_PARAMS, CleanLossSum, LossChange
from sinkscope.probes.stats import median

SOURCE = "SPEC.md 'Massive activations'; Sun et al. 2024 (criterion |a| > 100 and >= 1000 x median)"
DEFAULT_TOP_K = 10
DEFAULT_MIN_ABS = 100.0
DEFAULT_MIN_RATIO = 1000.0
#: the buffer's fields, each (L, k): |h|, h, (position * C + channel) or -1 for an empty slot, token, criterion met.
FIELDS = ("value", "signed", "key", "token", "massive")


def _positive_int(value: int) -> str | None:
    return None if value >= 1 else "must be at least 1"




def fold_top(buffer: dict[str, Tensor], candidates: dict[str, Tensor], k: int) -> dict[str, Tensor]:
    """The k largest distinct keys of ``buffer`` (earlier) and ``candidates`` (later), each field (M,).

    A key keeps its largest value (on a tie the earlier one); equal values of distinct keys are
    ordered by key, so the result does not depend on how the windows were batched or split.
    """
    joined = {f: torch.cat([buffer[f], candidates[f].to(buffer[f].device, buffer[f].dtype)]) for f in FIELDS}
    order = torch.sort(joined["value"], descending=True, stable=True).indices  # (M,) largest first, earlier on ties
    order = order[torch.sort(joined["key"][order], stable=True).indices]  # (M,) grouped by key, largest first
    keys = joined["key"][order]
    first = torch.ones_like(keys, dtype=torch.bool)
    first[1:] = keys[1:] != keys[:-1]  # (M,) the largest of each key
    value = torch.where(first, joined["value"][order], torch.full_like(joined["value"][order], -2.0))
    pick = order[torch.sort(value, descending=True, stable=True).indices[:k]]  # (k,)
    out = {f: joined[f][pick] for f in FIELDS}
    dropped = torch.sort(value, descending=True, stable=True).values[:k] < -1.5  # duplicates when M has < k keys
    out["value"] = torch.where(dropped, torch.full_like(out["value"], -1.0), out["value"])
    out["key"] = torch.where(dropped, torch.full_like(out["key"], -1), out["key"])
    return out


@register_probe(
    "massive_topk",
    params=(
        Param("top_k", int, DEFAULT_TOP_K, "entries per layer (distinct by position and channel)", check=_positive_int),
        Param("min_abs", float, DEFAULT_MIN_ABS, "criterion: |h| above this", check=non_negative),
        Param("min_ratio", float, DEFAULT_MIN_RATIO, "criterion: |h| at least this times the window's median |h|",
              check=non_negative),
        Param("means", bool, False, "also sum h at every (layer, position, channel), for a mean intervention"),
        CLEAN_LOSS_PARAM,
    ),
    metrics={
        "massive_topk": MetricInfo(
            "Top residual activations", "|h|",
            "the layer's top_k largest |h| over windows, distinct by (position, channel); columns rank, channel, "
            "position, token_id/token, signed (h) and massive (1 = |h| > min_abs and >= min_ratio x the window's "
            "median |h|)", SOURCE, "massive = 1: a massive activation in Sun et al.'s sense", per="layer"),
        "massive_count": MetricInfo(
            "Massive activations per window", "entries",
            "mean over windows of the number of entries of the layer's hidden state meeting the criterion",
            SOURCE, "a few (1 to 4) at fixed channels and positions is Sun et al.'s pattern", per="layer"),
    },
)
class MassiveTopK(CleanLossSum, Probe):
    """The top-k residual activations per layer with channel, position and token; Sun et al.'s criterion."""

    not_state = ("_batch",)

    def setup(self) -> None:
        L, k = self.spec.n_layers, self.top_k
        self.top = {"value": torch.full((L, k), -1.0, dtype=torch.float64),
                    "signed": torch.zeros(L, k, dtype=torch.float64),
                    "key": torch.full((L, k), -1, dtype=torch.int64),
                    "token": torch.zeros(L, k, dtype=torch.int64),
                    "massive": torch.zeros(L, k, dtype=torch.float64)}
        self.counts = torch.zeros(L, dtype=torch.float64)  # entries meeting the criterion, summed over windows
        self.windows = torch.zeros(L, dtype=torch.float64)
        self.width = torch.zeros(L, dtype=torch.int64)  # C of each layer (to split the keys)
        self.sums = torch.zeros(0, dtype=torch.float64)  # (L, T, C) with ``means``, allocated on first use
        self._batch: dict[str, Tensor] = {}
        self.setup_clean_loss()  # the clean loss for --massive-intervention's second stage (clean_loss)

    @observes(hooks.TOKENS)
    def tokens(self, layer: None, ids: Tensor) -> None:
        self._batch["ids"] = ids  # (B, T)

    @observes(hooks.RESID_POST)
    def residual(self, layer: int, hidden: Tensor) -> None:
        h = hidden.detach()  # (B, T, C)
        B, T, C = h.shape
        device = h.device
        if self.top["value"].device != device:
            self.top = {f: t.to(device) for f, t in self.top.items()}
            self.counts, self.windows, self.width = self.counts.to(device), self.windows.to(device), \
                self.width.to(device)
        signed = h.reshape(B, T * C)  # (B, T*C)
        flat = signed.abs()
        middle = median(flat, dim=-1, dtype=torch.float32).to(torch.float64).unsqueeze(-1)  # (B, 1) per window
        meets = (flat.double() > self.min_abs) & (flat.double() >= self.min_ratio * middle)  # (B, T*C)
        self.counts[layer] += meets.sum()
        self.windows[layer] += B
        self.width[layer] = C
        k = min(self.top_k, T * C)
        value, index = flat.topk(k, dim=-1)  # (B, k) each window's largest entries
        ids = self._batch["ids"].to(device)  # (B, T)
        candidates = {"value": value.double().reshape(-1), "signed": signed.gather(1, index).double().reshape(-1),
                      "key": index.reshape(-1), "token": ids.gather(1, index // C).reshape(-1),
                      "massive": meets.gather(1, index).double().reshape(-1)}
        folded = fold_top({f: t[layer] for f, t in self.top.items()}, candidates, self.top_k)
        for f in FIELDS:
            self.top[f] = torch.cat([self.top[f][:layer], folded[f].unsqueeze(0), self.top[f][layer + 1:]])
        if self.means:
            if self.sums.numel() == 0:
                self.sums = torch.zeros(self.spec.n_layers, T, C, dtype=torch.float64, device=device)
            self.sums[layer] += h.double().sum(0)  # (T, C)

    def merge(self, other: "MassiveTopK") -> None:
        """Counts and sums add; the top k are folded (this share's windows first)."""
        theirs = {f: t.to(self.top[f].device) for f, t in other.top.items()}
        rows = [fold_top({f: self.top[f][l] for f in FIELDS}, {f: theirs[f][l] for f in FIELDS}, self.top_k)
                for l in range(self.spec.n_layers)]
        self.top = {f: torch.stack([r[f] for r in rows]) for f in FIELDS}
        self.counts = self.counts + other.counts.to(self.counts.device)
        self.windows = self.windows + other.windows.to(self.windows.device)
        self.width = torch.maximum(self.width, other.width.to(self.width.device))
        self.clean_loss_sum = self.clean_loss_sum + other.clean_loss_sum.to(self.clean_loss_sum.device)
        self.clean_loss_n = self.clean_loss_n + other.clean_loss_n.to(self.clean_loss_n.device)
        if other.sums.numel():
            self.sums = other.sums.to(self.counts.device).clone() if self.sums.numel() == 0 else \
                self.sums + other.sums.to(self.sums.device)

    def entries(self) -> list[dict]:
        """Every top-k entry, in layer then rank order: layer, rank, value, signed, position, channel, token, massive."""
        top = {f: t.cpu() for f, t in self.top.items()}
        width, windows = self.width.cpu(), self.windows.cpu()
        out = []
        for l in range(self.spec.n_layers):
            if windows[l] == 0:
                continue
            C = int(width[l])
            for r in range(self.top_k):
                key = int(top["key"][l, r])
                if key < 0:
                    continue
                out.append({"layer": l, "rank": r + 1, "value": float(top["value"][l, r]),
                            "signed": float(top["signed"][l, r]), "position": key // C, "channel": key % C,
                            "token": int(top["token"][l, r]), "massive": bool(top["massive"][l, r] > 0.5)})
        return out

    def mean_at(self, layer: int, position: int, channel: int) -> float:
        """The mean of h over the windows at one entry (needs ``means``)."""
        if self.sums.numel() == 0:
            raise SinkscopeError("the massive_topk probe did not keep the sums a mean intervention needs (means).")
        return float(self.sums[layer, position, channel].cpu() / self.windows[layer].cpu())

    def intervention_entries(self) -> list[tuple[int, int, int]]:
        """(layer, position, channel) to set: every massive top-k entry, at the first layer where it is massive."""
        first: dict[tuple[int, int], int] = {}
        for e in self.entries():
            if e["massive"]:
                first.setdefault((e["position"], e["channel"]), e["layer"])
        return sorted((layer, position, channel) for (position, channel), layer in first.items())

    def rows(self) -> list[Row]:
        rows: list[Row] = []
        windows, counts = self.windows.cpu(), self.counts.cpu()
        for e in self.entries():
            n = int(windows[e["layer"]])
            rows.append(Row(self.name, "massive_topk", e["layer"], None, e["value"], n,
                            (("rank", e["rank"]), ("channel", e["channel"]), ("position", e["position"]),
                             ("token_id", e["token"]), ("signed", e["signed"]), ("massive", int(e["massive"])))))
        for l in range(self.spec.n_layers):
            if windows[l] > 0:
                rows.append(Row(self.name, "massive_count", l, None, float(counts[l] / windows[l]), int(windows[l])))
        return rows


_ENTRY = re.compile(r"^(\d+):(\d+):(\d+)=(\S+)$")
INTERVENED = "intervened"


def parse_entry(item: object) -> tuple[int, int, int, float] | None:
    """``"2:0:123=0.5"`` -> (2, 0, 123, 0.5); None unless it is LAYER:POSITION:CHANNEL=VALUE with a number
    Python's ``float`` reads (``nan`` and ``inf`` in any case included)."""
    match = _ENTRY.match(str(item).strip())
    if match is None:
        return None
    layer, position, channel, value = match.groups()
    try:
        return int(layer), int(position), int(channel), float(value)
    except ValueError:
        return None


def _check_entries(entries: tuple) -> str | None:
    bad = [e for e in entries if parse_entry(e) is None]
    return f"takes LAYER:POSITION:CHANNEL=VALUE items such as 2:0:123=0, not {bad[0]!r}" if bad else None


def format_entry(layer: int, position: int, channel: int, value: float) -> str:
    return f"{layer}:{position}:{channel}={value!r}"


@register_probe(
    "massive_intervention",
    params=(Param("entries", tuple, (), "residual entries to set, LAYER:POSITION:CHANNEL=VALUE (comma-separated)",
                  check=_check_entries),
            Param("mode", str, "zero", "zero | mean: what the entries were set to (recorded; VALUE says it)",
                  choices=("zero", "mean")),
            *CLEAN_PARAMS),
    metrics={
        "massive_loss_clean": MetricInfo("Loss, clean", "nats / token",
                                         "mean next-token cross-entropy over windows and positions; n = the windows; no se (only the loss summed over every prediction is kept)",
                                         SOURCE, "",
                                         per="model"),
        "massive_loss_intervened": MetricInfo(
            "Loss, massive activations set", "nats / token",
            "the same loss with the entries set to zero or their mean at hook_resid_post of their first layer; "
            "no se (as massive_loss_clean)",
            "Sun et al. 2024 §3 (intervention); Owen et al.", "", per="model"),
        "massive_loss_delta": MetricInfo("Loss change from setting the massive activations", "nats / token",
                                         "massive_loss_intervened - massive_loss_clean on the same windows; no se "
                                         "(no per-window loss is kept)",
                                         "Sun et al. 2024", "near 0 = benign; large = the model needs them",
                                         per="model"),
        "massive_ppl_clean": MetricInfo("Perplexity, clean", "ppl", "exp(massive_loss_clean)", SOURCE, "",
                                        per="model"),
        "massive_ppl_intervened": MetricInfo("Perplexity, massive activations set", "ppl",
                                             "exp(massive_loss_intervened)", SOURCE, "", per="model"),
        "massive_entries": MetricInfo("Entries set", "entries", "how many (layer, position, channel) entries (a count: no se)", SOURCE,
                                      "", per="model"),
    },
)
class MassiveIntervention(LossChange):
    """The loss with and without the listed residual entries set to a value, on the same windows."""

    changed_pass = INTERVENED

    def setup(self) -> None:
        self.targets: dict[int, list[tuple[int, int, float]]] = {}
        for item in self.entries:
            layer, position, channel, value = parse_entry(item)  # checked by the parameter (_check_entries)
            if not 0 <= layer < self.spec.n_layers:
                raise SinkscopeError(f"the entry {item} names layer {layer}; the model has {self.spec.n_layers}.")
            self.targets.setdefault(layer, []).append((position, channel, value))
        self.setup_loss(bool(self.targets))

    @intervenes(hooks.RESID_POST)
    def set_entries(self, layer: int, hidden: Tensor) -> Tensor | None:  # hidden: (B, T, C)
        if self.pass_label != INTERVENED or layer not in self.targets:
            return None
        hidden = hidden.clone()
        for position, channel, value in self.targets[layer]:
            if position < hidden.shape[1]:
                hidden[:, position, channel] = value
        return hidden

    def rows(self) -> list[Row]:
        clean, changed, n = self.losses()
        entries = sum(len(v) for v in self.targets.values())
        return [Row(self.name, "massive_loss_clean", None, None, clean, n),
                Row(self.name, "massive_loss_intervened", None, None, changed, n),
                Row(self.name, "massive_loss_delta", None, None, changed - clean, n),
                Row(self.name, "massive_ppl_clean", None, None, math.exp(clean) if n else float("nan"), n),
                Row(self.name, "massive_ppl_intervened", None, None, math.exp(changed) if n else float("nan"), n),
                Row(self.name, "massive_entries", None, None, float(entries), n)]
