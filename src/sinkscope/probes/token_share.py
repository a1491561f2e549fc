"""Token-identity share of gate variance and the per-token gate table (SPEC.md "Token-identity
variance share" and "Per-token gate table"; Wang 2026 appendix "Token identity and content" and
"What the filter removes").

Every value-gate value g_j comes with the token t at its position j. Per (layer, head), over all
positions of all windows (N values; n_t of them at token t, with mean g_t; grand mean g):

    total SS_h   = sum_j (g_j - g)^2
    between SS_h = sum_t n_t (g_t - g)^2
    share        = sum over heads of between SS / sum over heads of total SS

pooled exactly so: the per-head row is between_h / total_h, the layer row pools the layer's
heads, the model row pools every head of every layer (it is *not* a mean of head shares).
``token_share_frequent`` (column ``min_count`` = 50) is the same share over the positions whose token occurs at least 50
times in the run (``min_count``), with the grand mean of those positions. A gate that is a
function of the token id alone has share 1; a gate independent of the token has, for K
distinct tokens among N values, expected share (K - 1) / (N - 1), so a share is only read
against that floor, reported beside it (SPEC.md, "Resolved (2026-12)")::

    token_share_chance = (K - 1) / (N - 1)
    token_share_excess = (share - chance) / (1 - chance) = 1 - (1 - share) (N - 1) / (N - K)

The chance level is exact, not an approximation: for any fixed gate values, shuffling them over
the N positions (token counts n_t held) gives E[between SS] = total SS (K - 1) / (N - 1),
because E[n_t (mean_t - mean)^2] = s^2 (1 - n_t / N) under sampling without replacement
(s^2 = total SS / (N - 1)); for iid normal values between/total is Beta((K-1)/2, (N-K)/2).
The excess is the share of the variance *left over by chance* that token identity explains:
0 on average for a token-blind gate, 1 for a function of the token; it equals the adjusted R^2
of the one-way model with K - 1 token indicators (epsilon^2-like). For ``token_share_frequent`` K
and N count only the positions of the tokens kept (K = tokens seen at least min_count times,
N = their occurrences), the same positions the share uses. Layer and model rows pool the
chance levels as they pool the shares: sum_h c_h total_h / sum_h total_h (the permutation
expectation of the pooled share; every head of a run sees the same K and N, so it is their
common c), and the excess of a pooled row is computed from the pooled share and chance.

Streaming and exact: per (layer, head, token) the probe keeps the count, the sum and the sum of
squares of x = g - 1/2 (shifted so that float64 sums keep every digit that matters) in
vocabulary-sized float64 arrays (:class:`TokenSums`; 2 L H V + L V numbers, e.g. 4 layers x 4
heads x 4,096 tokens = 0.6 MB; 12 x 12 x 50,257 = 116 MB), never a list of gate values; then

    total_h   = sum_t Q_ht - S_h^2 / N,      between_h = sum_t S_ht^2 / n_t - S_h^2 / N

with S_ht, Q_ht the sums of x and x^2 at token t and S_h = sum_t S_ht. The sums only add, so
data-parallel shares merge and resumed runs continue exactly.

``token_gate`` rows are the per-token gate table: for every token seen, its mean gate over
occurrences, heads and layers, with ``n`` its number of occurrences and the token id in the
``token_id`` column (the pipeline adds the decoded ``token``); the report lists the most and
least attenuated tokens among those seen at least ``min_count`` times. The ``head`` column of
the share rows indexes value heads.
"""

from __future__ import annotations

import numpy as np
import torch
from torch import Tensor

from sinkscope.capture import hooks
from sinkscope.capture.record import AttentionRecord
from sinkscope.probes.base import Accumulator, Param, Probe, _accumulate_dtype, observes, register_probe
from sinkscope.store.results import MetricInfo, Row

SOURCE = "SPEC.md 'Token-identity variance share'; Wang 2026 appendix 'Token identity and content'"
#: the gate is accumulated as g - SHIFT: values in (-1/2, 1/2) keep the sums of squares well conditioned.
SHIFT = 0.5
DEFAULT_MIN_COUNT = 50


class TokenSums(Accumulator):
    """Per (layer, head, token id): count, sum and sum of squares of x = value - 1/2.

    Arrays are vocabulary-sized, on the device of the values added (float64 where the device
    has it), allocated per layer on first use; without a known vocabulary size they grow to the
    largest id seen (one host read per batch). Counts are per (layer, token): every head of a
    layer sees the same positions.
    """

    def __init__(self, n_layers: int, n_heads: int, vocab_size: int | None = None):
        self.n_layers, self.n_heads, self.vocab_size = n_layers, n_heads, vocab_size
        self.sums: dict[int, Tensor] = {}  # layer -> (H, V)
        self.squares: dict[int, Tensor] = {}  # layer -> (H, V)
        self.counts: dict[int, Tensor] = {}  # layer -> (V,) int64

    def _reserve(self, layer: int, size: int, device: torch.device, dtype: torch.dtype) -> None:
        """Make the layer's arrays at least ``size`` tokens wide (zeros for new tokens)."""
        if layer not in self.sums:
            self.sums[layer] = torch.zeros(self.n_heads, size, dtype=dtype, device=device)  # (H, V)
            self.squares[layer] = torch.zeros(self.n_heads, size, dtype=dtype, device=device)  # (H, V)
            self.counts[layer] = torch.zeros(size, dtype=torch.int64, device=device)  # (V,)
        elif size > self.counts[layer].numel():
            grow = size - self.counts[layer].numel()
            self.sums[layer] = torch.nn.functional.pad(self.sums[layer], (0, grow))  # (H, V')
            self.squares[layer] = torch.nn.functional.pad(self.squares[layer], (0, grow))  # (H, V')
            self.counts[layer] = torch.nn.functional.pad(self.counts[layer], (0, grow))  # (V',)

    def add(self, layer: int, ids: Tensor, values: Tensor) -> None:
        """Add ``values`` (B, H, S) at the token ids ``ids`` (B, S)."""
        x = values.detach()
        x = x.to(_accumulate_dtype(x.device)) - SHIFT  # (B, H, S)
        B, H, S = x.shape
        flat_ids = ids.reshape(-1).to(x.device)  # (B*S,)
        x = x.transpose(0, 1).reshape(H, B * S)  # (H, B*S): head-major, same order as flat_ids
        size = self.vocab_size if self.vocab_size is not None else int(flat_ids.max()) + 1
        self._reserve(layer, size, x.device, x.dtype)
        # out of place: the arrays may be inference tensors (made in the forward loop) or not (a resumed state)
        self.sums[layer] = self.sums[layer].index_add(1, flat_ids, x)  # (H, V)
        self.squares[layer] = self.squares[layer].index_add(1, flat_ids, x * x)  # (H, V)
        self.counts[layer] = self.counts[layer] + torch.bincount(flat_ids, minlength=self.counts[layer].numel())  # (V,)

    def snapshot(self) -> "TokenSums":
        """A copy sharing the arrays: ``add`` and ``merge`` replace them and never write into them."""
        copy_ = TokenSums(self.n_layers, self.n_heads, self.vocab_size)
        copy_.sums, copy_.squares, copy_.counts = dict(self.sums), dict(self.squares), dict(self.counts)
        return copy_

    @property
    def layers(self) -> list[int]:
        return sorted(self.sums)

    def width(self) -> int:
        return max((c.numel() for c in self.counts.values()), default=0)

    def arrays(self, layer: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(counts (V,), sums (H, V), squares (H, V)) of one layer as float64 numpy arrays (CPU)."""
        return (self.counts[layer].to("cpu", torch.float64).numpy(), self.sums[layer].to("cpu", torch.float64).numpy(),
                self.squares[layer].to("cpu", torch.float64).numpy())

    def state_dict(self) -> dict[str, Tensor]:
        V = self.width()
        L, H = self.n_layers, self.n_heads
        state = {"sums": torch.zeros(L, H, V, dtype=torch.float64), "squares": torch.zeros(L, H, V, dtype=torch.float64),
                 "counts": torch.zeros(L, V, dtype=torch.int64), "seen": torch.zeros(L, dtype=torch.bool)}
        for layer in self.layers:
            width = self.counts[layer].numel()
            state["sums"][layer, :, :width] = self.sums[layer].to("cpu", torch.float64)
            state["squares"][layer, :, :width] = self.squares[layer].to("cpu", torch.float64)
            state["counts"][layer, :width] = self.counts[layer].cpu()
            state["seen"][layer] = True
        return state

    def load_state_dict(self, state: dict[str, Tensor]) -> None:
        self.sums, self.squares, self.counts = {}, {}, {}
        for layer in range(self.n_layers):
            if state["seen"][layer]:
                self.sums[layer] = state["sums"][layer].clone()
                self.squares[layer] = state["squares"][layer].clone()
                self.counts[layer] = state["counts"][layer].clone()

    def merge(self, other: "TokenSums") -> None:
        """Add another share's sums (its windows, seen after these)."""
        for layer in other.layers:
            theirs = (other.sums[layer], other.squares[layer], other.counts[layer])
            if layer not in self.sums:
                self.sums[layer], self.squares[layer], self.counts[layer] = (t.clone() for t in theirs)
                continue
            device, dtype = self.sums[layer].device, self.sums[layer].dtype
            width = max(theirs[2].numel(), self.counts[layer].numel())
            self._reserve(layer, width, device, dtype)
            grow = width - theirs[2].numel()
            pad = torch.nn.functional.pad
            self.sums[layer] = self.sums[layer] + pad(theirs[0].to(device, dtype), (0, grow))  # (H, V)
            self.squares[layer] = self.squares[layer] + pad(theirs[1].to(device, dtype), (0, grow))  # (H, V)
            self.counts[layer] = self.counts[layer] + pad(theirs[2].to(device), (0, grow))  # (V,)


def chance_share(n_tokens: int, n_positions: int) -> float:
    """(K - 1) / (N - 1): the expected share of a token-blind gate (module docstring); NaN for N < 2."""
    return (n_tokens - 1) / (n_positions - 1) if n_positions > 1 else float("nan")


def excess_share(share: float, chance: float) -> float:
    """(share - chance) / (1 - chance): 0 = chance, 1 = a function of the token; NaN when undefined."""
    if not (np.isfinite(share) and np.isfinite(chance)) or chance >= 1.0:
        return float("nan")
    return float((share - chance) / (1.0 - chance))


def distinct_tokens(counts: np.ndarray, keep: np.ndarray) -> int:
    """K: how many tokens of ``keep`` occur at all."""
    return int((keep & (counts > 0)).sum())


def sums_of_squares(counts: np.ndarray, sums: np.ndarray, squares: np.ndarray,
                    keep: np.ndarray) -> tuple[np.ndarray, np.ndarray, int]:
    """(between SS (H,), total SS (H,), N) over the tokens ``keep`` (V,) bool, from per-token sums.

    total_h = sum_t Q_ht - S_h^2 / N and between_h = sum_t S_ht^2 / n_t - S_h^2 / N, the sums over
    tokens in ``keep`` with n_t > 0 (shift-invariant: x = g - 1/2 gives the SS of g).
    """
    keep = keep & (counts > 0)
    n = counts[keep]  # (K,)
    N = int(n.sum())
    if N == 0:
        nan = np.full(sums.shape[0], np.nan)
        return nan, nan, 0
    s, q = sums[:, keep], squares[:, keep]  # (H, K)
    grand = s.sum(axis=1) ** 2 / N  # (H,)
    total = q.sum(axis=1) - grand  # (H,)
    between = (s * s / n).sum(axis=1) - grand  # (H,)
    return between, total, N


@register_probe(
    "token_share",
    params=(Param("min_count", int, DEFAULT_MIN_COUNT,
                  "the token_share_frequent rows and the token tables count only tokens seen at least K times",
                  check=lambda v: None if v >= 1 else "must be at least 1"),),
    metrics={
        "token_share": MetricInfo(
            "Token-identity share", "share of gate variance",
            "between-token SS / total SS of the value gate g_j over every position j and window, with the "
            "token at j as the group; per head, pooled over the heads of a layer (layer rows) and over every head "
            "(model row): sum of between SS over heads / sum of total SS over heads",
            SOURCE, "1 = the gate is a function of the token id alone; near (K-1)/(N-1) = independent of it",
            per="layer x KV head"),
        "token_share_chance": MetricInfo(
            "Token-identity share at chance", "share of gate variance",
            "(K - 1) / (N - 1) for K distinct tokens among the N positions: the exact expected token_share of a "
            "gate shuffled over the positions (token-blind); layer and model rows pool it as the share is pooled "
            "(weighted by total SS)",
            "SPEC.md 'Token-identity variance share', Resolved (2026-12)",
            "the floor token_share is read against; small only when N >> K", per="layer x KV head"),
        "token_share_excess": MetricInfo(
            "Token-identity share above chance", "share of the variance left by chance",
            "(token_share - token_share_chance) / (1 - token_share_chance) = 1 - (1 - share)(N - 1)/(N - K), "
            "the adjusted R^2 of the token groups",
            "SPEC.md 'Token-identity variance share', Resolved (2026-12)",
            "0 = no more than a token-blind gate; 1 = the gate is a function of the token id",
            per="layer x KV head"),
        "token_share_frequent": MetricInfo(
            "Token-identity share, frequent tokens", "share of gate variance",
            "token_share over the positions whose token occurs at least K times in the run, K in the min_count "
            f"column (--min-count; default {DEFAULT_MIN_COUNT}), pooled the same way",
            SOURCE, "as token_share, less inflated by tokens seen a few times", per="layer x KV head"),
        "token_share_chance_frequent": MetricInfo(
            "Token-identity share at chance, frequent tokens", "share of gate variance",
            "(K - 1) / (N - 1) with K the tokens seen at least min_count times and N their positions only",
            "SPEC.md 'Token-identity variance share', Resolved (2026-12)",
            "the floor token_share_frequent is read against", per="layer x KV head"),
        "token_share_excess_frequent": MetricInfo(
            "Token-identity share above chance, frequent tokens", "share of the variance left by chance",
            "(token_share_frequent - its chance) / (1 - its chance), on the same positions",
            "SPEC.md 'Token-identity variance share', Resolved (2026-12)",
            "0 = chance; 1 = a function of the token id", per="layer x KV head"),
        "token_gate": MetricInfo(
            "Mean gate per token", "gate value",
            "for each token seen: the mean value gate over its occurrences, heads and layers; n = its number of "
            "occurrences, no se (occurrences in one window are not independent draws); the token_id column names "
            "it (and token decodes it)",
            "SPEC.md 'Per-token gate table'; Wang 2026 appendix 'What the filter removes'",
            "low = the gate attenuates reads of this token", per="token"),
    },
)
class TokenShare(Probe):
    """How much of a value gate's variance the token identity explains, and the gate per token."""

    min_count: int
    not_state = ("_batch",)

    def setup(self) -> None:
        self.sums = TokenSums(self.spec.n_layers, self.spec.n_kv_heads, self.spec.vocab_size)
        self._batch: dict[str, Tensor] = {}  # the batch's token ids (not accumulated: not_state)

    @observes(hooks.TOKENS)
    def tokens(self, layer: None, ids: Tensor) -> None:
        self._batch["ids"] = ids  # (B, T)

    @observes(hooks.ATTN)
    def attention(self, layer: int, record: AttentionRecord) -> None:
        if record.value_gate is None:
            return
        ids = self._batch["ids"]  # (B, S)
        if ids.shape != (record.value_gate.shape[0], record.value_gate.shape[-1]):
            raise ValueError(f"token ids {tuple(ids.shape)} do not match the gate's positions "
                             f"{tuple(record.value_gate.shape)}")
        self.sums.add(layer, ids, record.value_gate.float())  # (B, Hkv, S) at (B, S)

    def rows(self) -> list[Row]:
        rows: list[Row] = []
        layers = self.sums.layers
        for threshold in (1, self.min_count):
            tail, cond = ("_frequent", (("min_count", self.min_count),)) if threshold != 1 else ("", ())
            metric, chance_metric, excess_metric = (f"token_share{tail}", f"token_share_chance{tail}",
                                                    f"token_share_excess{tail}")
            shares, chances, excesses = [], [], []

            def emit(layer, head, share, chance, n):
                shares.append(Row(self.name, metric, layer, head, share, n, cond))
                chances.append(Row(self.name, chance_metric, layer, head, chance, n, cond))
                excesses.append(Row(self.name, excess_metric, layer, head, excess_share(share, chance), n, cond))

            pooled_between = pooled_total = pooled_chance = 0.0
            pooled_n = 0
            for layer in layers:
                counts, sums, squares = self.sums.arrays(layer)
                keep = counts >= threshold
                between, total, N = sums_of_squares(counts, sums, squares, keep)
                chance = chance_share(distinct_tokens(counts, keep), N)  # the same for every head of the layer
                for head in range(len(between)):
                    emit(layer, head, _ratio(between[head], total[head]), chance, N)
                layer_between, layer_total = float(between.sum()), float(total.sum())
                emit(layer, None, _ratio(layer_between, layer_total), chance, N * len(between))
                if N and layer_total > 0:
                    pooled_between += layer_between
                    pooled_total += layer_total
                    pooled_chance += chance * layer_total  # weighted by total SS, as the share pools
                pooled_n += N * len(between)
            if layers:
                layer_chances = [r.value for r in chances if r.head is None]
                model_chance = _ratio(pooled_chance, pooled_total) if pooled_total > 0 else \
                    float(np.nanmean(layer_chances)) if not np.isnan(layer_chances).all() else float("nan")
                emit(None, None, _ratio(pooled_between, pooled_total), model_chance, pooled_n)
            rows += shares + chances + excesses
        return rows + self.token_rows()

    def token_rows(self) -> list[Row]:
        """One ``token_gate`` row per token seen: mean gate over occurrences, heads and layers."""
        layers = self.sums.layers
        if not layers:
            return []
        width = self.sums.width()
        gate_sum, value_count, occurrences = np.zeros(width), np.zeros(width), None
        for layer in layers:
            counts, sums, _ = self.sums.arrays(layer)
            gate_sum[:counts.size] += sums.sum(axis=0)
            value_count[:counts.size] += counts * sums.shape[0]
            if occurrences is None:
                occurrences = np.zeros(width)
                occurrences[:counts.size] = counts
        seen = np.flatnonzero(value_count > 0)
        means = gate_sum[seen] / value_count[seen] + SHIFT
        return [Row(self.name, "token_gate", None, None, float(m), int(occurrences[t]), (("token_id", int(t)),))
                for t, m in zip(seen, means)]


def _ratio(between: float, total: float) -> float:
    """between / total; NaN when the gate has no variance (or no positions qualify)."""
    return float(between / total) if total > 0 else float("nan")
