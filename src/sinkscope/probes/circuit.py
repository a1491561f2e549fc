"""The position-zero circuit (SPEC.md "The position-zero circuit"; seed 003 §2-3).

Five probes, each reading only named hook points (``capture/hooks.py``), so they run on every
Hugging Face family and on the trainer's own model alike. ``sinkscope circuit`` runs them
together (``commands/circuit.py``).

``p0_norm`` (``hook_resid_post``), per layer l, over windows w:

    p0_norm         = mean_w ||h_l[w, 0]||
    other_norm      = mean_w median_{t >= 1} ||h_l[w, t]||      (exact median per window)
    p0_norm_ratio   = p0_norm / other_norm
    p0_norm_separates (model row) = the first layer whose ratio exceeds ``threshold`` (2); NaN if none
    p0_cosine       = mean over pairs of windows w != v of cos(h_l[w, 0], h_l[v, 0])
    later_cosine    = the same at position ``position`` (64, capped to seq_len - 1)

The pairwise mean is streamed exactly: with unit vectors u_w, sum_{w != v} u_w . u_v =
||sum_w u_w||^2 - N, over N (N - 1) ordered pairs.

``attn_out_norm`` (one layer, the first attention layer by default; seed 003 §3.2 Table 2), over
windows w, one row per position t:

    attn_z_norm[h, t]   = mean_w ||z[w, t, h]||,  z_h[t] = sum_j a_tj v_j   (hook_z: the seed's quantity,
                          attention as a weighted sum of value vectors, before W_O; per head h)
    attn_z_norm[t]      = mean_w ||z[w, t, :, :]||                          (pooled over heads, no head: the
                          norm of every head's z side by side, the vector W_O maps to hook_attn_out)
    attn_out_norm[t]    = mean_w ||hook_attn_out[w, t]||                    (after W_O, beside it)

and for each curve y (per head and pooled; after W_O pooled only) ``*_p0_ratio = y_0 / mean_{t>=1}
y_t`` and ``*_trend`` = the least-squares slope of
y_t against log2 t over t >= 1, over mean_{t>=1} y_t (relative change per doubling of position;
< 0 = the norm falls with position, as seed 003 argues from sum_j a_tj^2). Resolved (SPEC.md,
2026-12): the hook_z numbers are the headline. The pooled row is the norm of the concatenated
heads, not the mean of the per-head rows (that mean can be recomputed from them; the norm of the
concatenation cannot). Where the model has an output gate, hook_z is after it (what W_O reads).

``mlp_pca`` / ``mlp_pca_up`` (``mlp.hook_pre`` / ``mlp.hook_pre_linear`` of one layer, 0 by
default; ``commands/circuit.py`` takes the up projection, ``hook_pre_linear``, on gated MLPs as
seed 003 does, ``hook_pre`` elsewhere): PCA over every position of every window from a
streaming covariance (float64 sums of x and x x^T, kept apart for position 0 and the rest:
memory 2 F^2 doubles per pass, F = the MLP width; nothing grows with the windows but the
scatter sample). With ``heads`` (``LAYER.HEAD``, heads of the PCA layer only) a second pass zeroes
those heads at ``hook_z``: at the PCA layer this removes exactly ``hook_result[..., h, :]`` from
the residual stream the MLP reads (the heads' outputs add into it; nothing else in the layer
depends on them), so the pre-activation is that of the residual without those heads. The PCA is
fitted again on that pass. ``pca_separation = |mean PC1(position 0) - mean PC1(others)| /
std PC1(others)`` (population std); PC1's sign is chosen so the position-0 mean is >= its
others' mean. ``pca_separation_best`` is the largest of the same score along each of the 10 leading
components (``pca_separation_best_pc`` says which). The scatter sample (bounded): position 0 of *every* window, plus
``scatter_positions`` evenly spaced positions >= 1 of the first ``scatter_windows`` windows; its
PC1/PC2 coordinates are rows with ``point`` and ``position`` columns.

``p0_outliers`` (``hook_resid_pre`` and ``ln1.hook_normalized``, before and after the first
pre-norm of each layer): per channel c, ``z_c = (mean_w x[w, 0, c] - mean_{w, t>=1} x[w, t, c])
/ std_{w, t>=1} x[w, t, c]`` (population std over every other position of every window); the
``top`` channels by |z| per layer, ranked. A channel constant over the other positions (force-sink
zeroes its reserved channels there) has z = +-inf when position 0 differs, 0 when it does not.

``bos_experiment``: passes with their own inputs (``Probe.pass_inputs``). From each window take
the content ``K = window[1 : T - r_max + 1]`` (the window without its first token, which is the
BOS where the run adds one; short enough that the longest pass fits in T tokens), L = T - r_max
tokens. Passes, for each r in ``repeats`` (1, 2, 4, 8):

    with BOS     [BOS] * r + K                  (seed 003: in the w/ [BOS] setting BOS is repeated)
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

import copy
import math

import torch
from torch import Tensor

from sinkscope.capture import hooks
from sinkscope.capture.record import AttentionRecord
from sinkscope.commands.circuit import check_heads as _check_heads, check_repeats as _check_repeats
from sinkscope.errors import SinkscopeError
from sinkscope.probes.base import Accumulator, HeadMeans, MetricInfo, Param, Probe, Row, intervenes, observes, \
    register_probe
from sinkscope.probes.sink_rate import key_importance
from sinkscope.probes.stats import median

SUBTRACTED = "subtracted"
#: leading components searched by pca_separation_best.
TOP_PCS = 10


def _acc_dtype(device: torch.device) -> torch.dtype:
    return torch.float32 if device.type == "mps" else torch.float64


def _grow(t: Tensor, shape: tuple[int, ...], device) -> Tensor:
    """``t`` where it is needed: zeros of ``shape`` on ``device`` the first time (an empty placeholder)."""
    if t.numel() == 0:
        return torch.zeros(shape, dtype=_acc_dtype(torch.device(device)), device=device)
    return t if t.device == device else t.to(device)


class _LazyTensors(Probe):
    """A probe whose tensor accumulators are created on first use (empty placeholders before)."""

    def _added(self, mine: Tensor, theirs: Tensor) -> Tensor:
        """An empty placeholder takes the other share's tensor; an empty other adds nothing."""
        if theirs.numel() == 0:
            return mine
        if mine.numel() == 0:
            return theirs.clone()
        return mine + theirs.to(mine.device)


# ---- norms and directional convergence --------------------------------------------------------------


@register_probe(
    "p0_norm",
    params=(
        Param("position", int, 64, "the later position compared with position 0 (capped to seq_len - 1)",
              check=lambda v: None if v >= 1 else "must be at least 1"),
        Param("threshold", float, 2.0, "p0_norm_separates: the first layer whose norm ratio exceeds this",
              check=lambda v: None if v > 0 else "must be positive"),
    ),
    metrics={
        "p0_norm": MetricInfo(
            "Position-0 norm", "L2 norm", "||h_l[0]|| of hook_resid_post, averaged over windows",
            "SPEC.md 'The position-zero circuit'; seed 003 §3.1 Fig. 2", "", per="layer"),
        "other_norm": MetricInfo(
            "Median norm of the other positions", "L2 norm",
            "median over positions t >= 1 of ||h_l[t]|| (exact, per window), averaged over windows",
            "seed 003 §3.1 Fig. 2", "", per="layer"),
        "p0_norm_ratio": MetricInfo(
            "Position-0 norm / median other norm", "ratio", "p0_norm / other_norm",
            "seed 003 §3.1 Fig. 2", "higher = position 0 stands out", per="layer"),
        "p0_norm_separates": MetricInfo(
            "First layer with norm ratio > 2", "layer",
            "the first layer whose p0_norm_ratio exceeds the threshold (2); empty (NaN) if none does",
            "seed 003 §3.1 ('the norm grows early')", "lower = position 0 separates earlier", per="model"),
        "p0_cosine": MetricInfo(
            "Position-0 direction agreement", "mean pairwise cosine",
            "mean over pairs of windows w != v of cos(h_l[w, 0], h_l[v, 0]) (hook_resid_post)",
            "seed 003 §3.1 Fig. 2(c)", "near 1 = position 0 converges to one direction", per="layer"),
        "later_cosine": MetricInfo(
            "Later-position direction agreement", "mean pairwise cosine",
            "the same at a later position p (64, capped to seq_len - 1; the position column)",
            "seed 003 §3.1 Fig. 2(c) (control)", "", per="layer"),
    },
)
class P0Norm(_LazyTensors):
    """Position-0 norm against the other positions, and the direction's agreement across windows."""

    position: int
    threshold: float

    def setup(self) -> None:
        L = self.spec.n_layers
        empty = torch.zeros(0, dtype=torch.float64)
        self.p0_sum, self.median_sum = empty.clone(), empty.clone()  # (L,)
        self.unit0, self.unit_later = empty.clone(), empty.clone()  # (L, C): sums of unit vectors
        self.count = torch.zeros(L, dtype=torch.int64)  # windows per layer (host: from shapes)
        self.at = torch.zeros(1, dtype=torch.int64)  # the later position used (max over shares)

    @observes(hooks.RESID_POST)
    def residual(self, layer: int, hidden: Tensor) -> None:  # (B, T, C)
        B, T, C = hidden.shape
        L, device = self.spec.n_layers, hidden.device
        self.p0_sum, self.median_sum = _grow(self.p0_sum, (L,), device), _grow(self.median_sum, (L,), device)
        self.unit0, self.unit_later = _grow(self.unit0, (L, C), device), _grow(self.unit_later, (L, C), device)
        f = self.p0_sum.dtype
        h = hidden.detach().to(f)  # (B, T, C)
        norms = h.norm(dim=-1)  # (B, T)
        self.p0_sum[layer] += norms[:, 0].sum()
        if T > 1:
            self.median_sum[layer] += median(norms[:, 1:], dim=-1).sum()  # (B,) exact medians
        p = min(self.position, T - 1)
        self.at[0] = p
        self.unit0[layer] += (h[:, 0] / norms[:, 0:1].clamp_min(1e-30)).sum(0)  # (C,)
        self.unit_later[layer] += (h[:, p] / norms[:, p:p + 1].clamp_min(1e-30)).sum(0)  # (C,)
        self.count[layer] += B

    def merge(self, other: "P0Norm") -> None:
        at = torch.maximum(self.at, other.at)
        super().merge(other)
        self.at = at

    def rows(self) -> list[Row]:
        rows: list[Row] = []
        if self.p0_sum.numel() == 0:
            return rows
        p0, med = self.p0_sum.cpu().double(), self.median_sum.cpu().double()
        u0, ul = self.unit0.cpu().double(), self.unit_later.cpu().double()
        first = math.nan
        later = int(self.at[0])
        for layer in range(self.spec.n_layers):
            n = int(self.count[layer])
            if n == 0:
                continue
            a, b = float(p0[layer] / n), float(med[layer] / n)
            ratio = a / b if b > 0 else math.nan
            if math.isnan(first) and ratio > self.threshold:
                first = float(layer)
            rows += [Row(self.name, "p0_norm", layer, None, a, n), Row(self.name, "other_norm", layer, None, b, n),
                     Row(self.name, "p0_norm_ratio", layer, None, ratio, n)]
            if n >= 2:
                pairs = n * (n - 1)
                rows.append(Row(self.name, "p0_cosine", layer, None, float((u0[layer].square().sum() - n) / pairs),
                                pairs))
                rows.append(Row(self.name, "later_cosine", layer, None,
                                float((ul[layer].square().sum() - n) / pairs), pairs, (("position", later),)))
        rows.append(Row(self.name, "p0_norm_separates", None, None, first, int(self.count.max())))
        return rows


# ---- attention output norm against position ------------------------------------------------------


def _trend(curve: list[float]) -> float:
    """Relative change of a norm curve per doubling of position, over positions t >= 1.

    ``trend = b / mean_{t>=1} y_t`` with ``b`` the least-squares slope of ``y_t`` against
    ``log2 t`` (t = 1 .. T-1): negative = the norm falls as the query sees more keys (seed 003
    §3.2: sum_i p_i^2 shrinks with the length). NaN with fewer than two positions t >= 1.
    """
    if len(curve) < 3:
        return math.nan
    x = torch.log2(torch.arange(1, len(curve), dtype=torch.float64))  # (T-1,)
    y = torch.tensor(curve[1:], dtype=torch.float64)  # (T-1,)
    xc = x - x.mean()
    slope = float((xc * (y - y.mean())).sum() / xc.square().sum())
    return slope / float(y.mean()) if float(y.mean()) != 0 else math.nan


def _curve_rows(probe: str, metric: str, layer: int, head: int | None, curve: list[float], n: int) -> list[Row]:
    """One row per position, then ``metric_p0_ratio`` (position 0 over the mean of t >= 1) and ``metric_trend``."""
    rows = [Row(probe, metric, layer, head, v, n, (("position", t),)) for t, v in enumerate(curve)]
    if len(curve) > 1:
        rest = sum(curve[1:]) / (len(curve) - 1)
        rows.append(Row(probe, f"{metric}_p0_ratio", layer, head, curve[0] / rest if rest > 0 else math.nan, n))
        rows.append(Row(probe, f"{metric}_trend", layer, head, _trend(curve), n))
    return rows


_TABLE2 = "seed 003 §3.2 Table 2"


@register_probe(
    "attn_out_norm",
    params=(Param("layer", int, 0, "the layer whose hook_z and hook_attn_out are read",
                  check=lambda v: None if v >= 0 else "must be at least 0"),),
    metrics={
        "attn_z_norm": MetricInfo(
            "Norm of the weighted value sum by position (before W_O)", "L2 norm",
            "||z_h[t]|| = ||sum_j a_tj v_j|| of head h at hook_z (before W_O; after an output gate where there is "
            "one), averaged over windows; one row per position t, per head and pooled (the head-less row: "
            "||z[t]|| of all heads side by side, the vector W_O maps to hook_attn_out)", _TABLE2 + " (the seed's quantity: attention as a weighted sum of values)",
            "position 0 highest = its unmixed value (sum_j a_tj^2 = 1 there)", per="layer x head x position"),
        "attn_z_norm_p0_ratio": MetricInfo(
            "Weighted value sum norm, position 0 / others (before W_O)", "ratio",
            "attn_z_norm at position 0 over its mean at positions t >= 1, per head and pooled", _TABLE2, "> 1 = position 0's weighted value sum is larger",
            per="layer x head"),
        "attn_z_norm_trend": MetricInfo(
            "Weighted value sum norm, change per doubling of position (before W_O)", "share per doubling",
            "least-squares slope of attn_z_norm against log2 t over t >= 1, over its mean there; per head and "
            "pooled", _TABLE2 + " ('the norm decreases with sequence length')",
            "< 0 = the norm falls as the query sees more keys", per="layer x head"),
        "attn_out_norm": MetricInfo(
            "Attention-output norm by position (after W_O)", "L2 norm",
            "||hook_attn_out[t]|| of the same layer (after W_O and its bias, after Gemma 3's post-attention norm), "
            "averaged over windows; one row per position t", _TABLE2 + " (after the output projection: not the "
            "seed's quantity, reported beside it)", "", per="layer x position"),
        "attn_out_norm_p0_ratio": MetricInfo(
            "Attention-output norm, position 0 / others (after W_O)", "ratio",
            "attn_out_norm at position 0 over its mean at positions t >= 1", _TABLE2,
            "> 1 = position 0's projected attention output is larger", per="layer"),
        "attn_out_norm_trend": MetricInfo(
            "Attention-output norm, change per doubling of position (after W_O)", "share per doubling",
            "least-squares slope of attn_out_norm against log2 t over t >= 1, over its mean there", _TABLE2,
            "< 0 = the norm falls with position", per="layer"),
    },
)
class AttnOutNorm(_LazyTensors):
    """One layer's attention-output norm at every position (seed 003 Table 2), before and after W_O.

    Before W_O (``hook_z``, (B, T, H, D)) is the seed's quantity: attention as a weighted sum of
    value vectors, whose norm is largest at position 0 (only its own value, sum_j a_0j^2 = 1) and
    falls as the weights spread. After W_O (``hook_attn_out``, (B, T, C)) the heads are mixed by
    the output projection, which need not preserve that order.
    """

    layer: int

    def setup(self) -> None:
        self.z_sums = torch.zeros(0, dtype=torch.float64)  # (T, H): sums over windows of ||z_h[t]||
        self.z_pooled = torch.zeros(0, dtype=torch.float64)  # (T,): sums over windows of ||z[t]||, heads side by side
        self.sums = torch.zeros(0, dtype=torch.float64)  # (T,): sums over windows of ||attn_out[t]||
        self.z_count = torch.zeros(1, dtype=torch.int64)
        self.count = torch.zeros(1, dtype=torch.int64)

    @observes(hooks.ATTN_Z)
    def z(self, layer: int, value: Tensor) -> None:  # (B, T, H, D)
        if layer != self.layer:
            return
        B, T, H, _ = value.shape
        self.z_sums, self.z_pooled = _grow(self.z_sums, (T, H), value.device), _grow(self.z_pooled, (T,), value.device)
        z = value.detach().to(self.z_sums.dtype)  # (B, T, H, D)
        self.z_sums += z.norm(dim=-1).sum(0)  # (T, H)
        self.z_pooled += z.flatten(-2).norm(dim=-1).sum(0)  # (T,)
        self.z_count[0] += B

    @observes(hooks.ATTN_OUT)
    def attn_out(self, layer: int, value: Tensor) -> None:  # (B, T, C)
        if layer != self.layer:
            return
        B, T, _ = value.shape
        self.sums = _grow(self.sums, (T,), value.device)
        self.sums += value.detach().to(self.sums.dtype).norm(dim=-1).sum(0)
        self.count[0] += B

    def rows(self) -> list[Row]:
        rows: list[Row] = []
        n = int(self.z_count[0])
        if n and self.z_sums.numel():
            per_head = self.z_sums.cpu().double() / n  # (T, H)
            for head in range(per_head.shape[1]):
                rows += _curve_rows(self.name, "attn_z_norm", self.layer, head, per_head[:, head].tolist(), n)
            rows += _curve_rows(self.name, "attn_z_norm", self.layer, None,
                                (self.z_pooled.cpu().double() / n).tolist(), n)
        n = int(self.count[0])
        if n and self.sums.numel():
            rows += _curve_rows(self.name, "attn_out_norm", self.layer, None, (self.sums.cpu().double() / n).tolist(), n)
        return rows


# ---- PCA of the MLP pre-activation ------------------------------------------------------------------


def parse_subtracted(heads, layer: int, n_heads: int) -> list[int]:
    """``("0.3", "0.1")`` -> ``[1, 3]``: heads of the PCA layer; any other layer is one sentence."""
    out: set[int] = set()
    for item in heads:
        l, h = (int(x) for x in str(item).split("."))
        if l != layer:
            raise SinkscopeError(f"--subtract-head {item}: the layer-{layer} MLP reads only layer {layer}'s heads "
                                 f"(and the layers before, whose heads change everything after them); "
                                 f"give heads {layer}.0 to {layer}.{n_heads - 1}.")
        if not 0 <= h < n_heads:
            raise SinkscopeError(f"--subtract-head {item}: the model has heads 0 to {n_heads - 1}.")
        out.add(h)
    return sorted(out)


class _Sample(Accumulator):
    """The scatter sample per pass: rows of x (float32) with their window and position.

    Kept where they were computed until read; ``get`` returns them on the CPU in (window,
    position) order, so the points do not depend on the batch size. Merging concatenates.
    """

    def __init__(self):
        self.parts: dict[int, list[tuple[Tensor, Tensor, Tensor]]] = {}

    def add(self, k: int, x: Tensor, window: Tensor, pos: Tensor) -> None:
        self.parts.setdefault(k, []).append((x.detach().float().clone(), window, pos))

    def get(self, k: int) -> tuple[Tensor, Tensor, Tensor] | None:
        if not self.parts.get(k):
            return None
        x, window, pos = (torch.cat([p[i].cpu() for p in self.parts[k]]) for i in range(3))
        order = torch.argsort(window * (int(pos.max()) + 1) + pos, stable=True)
        return x[order], window[order], pos[order]

    def state_dict(self) -> dict:
        return {k: self.get(k) for k in self.parts if self.parts[k]}

    def load_state_dict(self, state: dict) -> None:
        self.parts = {k: [tuple(t.clone() for t in v)] for k, v in state.items()}

    def merge(self, other: "_Sample") -> None:
        """Another share's windows, numbered after this share's (shares hold consecutive windows)."""
        for k in other.parts:
            mine = self.get(k)
            offset = 0 if mine is None else int(mine[1].max()) + 1
            theirs = other.get(k)
            self.parts.setdefault(k, []).append((theirs[0].clone(), theirs[1] + offset, theirs[2].clone()))

    def snapshot(self) -> "_Sample":
        out = _Sample()
        out.parts = {k: list(v) for k, v in self.parts.items()}
        return out


_PCA_PARAMS = (
    Param("layer", int, 0, "the layer whose MLP pre-activation is analysed",
          check=lambda v: None if v >= 0 else "must be at least 0"),
    Param("heads", tuple, (), "heads of that layer to subtract, as LAYER.HEAD pairs (comma-separated)",
          check=_check_heads),
    Param("scatter_positions", int, 32, "positions >= 1 per window in the scatter sample (evenly spaced)",
          check=lambda v: None if v >= 0 else "must be at least 0"),
    Param("scatter_windows", int, 64, "windows whose other positions enter the scatter sample (position 0: all)",
          check=lambda v: None if v >= 0 else "must be at least 0"),
)


def _pca_metrics(point: str) -> dict[str, MetricInfo]:
    where = f"mlp.{point}"
    return {
        "pca_separation": MetricInfo(
            "Position-0 separation along PC1", "std of the others",
            f"|mean PC1(position 0) - mean PC1(others)| / std PC1(others), PCA of {where} over every position "
            "(streaming covariance); the subtracted column names heads removed first",
            "SPEC.md 'The position-zero circuit'; seed 003 §3.2 Fig. 3", "higher = position 0 separates", per="layer"),
        "pca_separation_best": MetricInfo(
            "Position-0 separation along its best leading PC", "std of the others",
            f"the same score along each of the {TOP_PCS} leading components; the largest (a sinkscope addition: "
            "PC1 of a content-dominated layer can miss a direction that isolates position 0)",
            "seed 003 §3.2 (sinkscope's extension)", "higher = position 0 separates", per="layer"),
        "pca_separation_best_pc": MetricInfo(
            "Which PC separates position 0 best", "component (1 = PC1)",
            f"the index among the {TOP_PCS} leading components of pca_separation_best", "sinkscope", "", per="layer"),
        "pca_explained_pc1": MetricInfo(
            "Variance explained by PC1", "share", f"PC1's eigenvalue over the trace of {where}'s covariance",
            "seed 003 §3.2", "", per="layer"),
        "pca_explained_pc2": MetricInfo(
            "Variance explained by PC2", "share", f"PC2's eigenvalue over the trace of {where}'s covariance",
            "seed 003 §3.2", "", per="layer"),
        "pca_scatter_pc1": MetricInfo(
            "Scatter sample, PC1", "PC1 coordinate",
            "PC1 coordinate of a sampled point (every position 0; evenly spaced other positions of the first "
            "windows); point and position columns", "seed 003 Fig. 3", "", per="point"),
        "pca_scatter_pc2": MetricInfo(
            "Scatter sample, PC2", "PC2 coordinate", "PC2 coordinate of the same point", "seed 003 Fig. 3", "",
            per="point"),
    }


class _MlpPca(_LazyTensors):
    """PCA of one layer's MLP pre-activation, position 0 marked, optionally without chosen heads."""

    layer: int
    heads: tuple
    scatter_positions: int
    scatter_windows: int

    def setup(self) -> None:
        self.targets = parse_subtracted(self.heads, self.layer, self.spec.n_heads)
        empty = torch.zeros(0, dtype=torch.float64)
        self.sum_all, self.sq_all = empty.clone(), empty.clone()  # (P, F), (P, F, F)
        self.sum_0, self.sq_0 = empty.clone(), empty.clone()
        self.count = torch.zeros(2, 2, dtype=torch.int64)  # (pass, [all, position 0])
        self.windows = torch.zeros(2, dtype=torch.int64)  # windows seen per pass (scatter budget)
        self.sample = _Sample()

    def passes(self) -> tuple[str | None, ...]:
        return (None, SUBTRACTED) if self.targets else (None,)

    @intervenes(hooks.ATTN_Z)
    def zero(self, layer: int, z: Tensor) -> Tensor | None:  # (B, T, H, D)
        if self.pass_label != SUBTRACTED or layer != self.layer:
            return None
        z = z.clone()
        z[:, :, self.targets] = 0
        return z

    def _observe(self, layer: int, pre: Tensor) -> None:  # (B, T, F)
        if layer != self.layer:
            return
        k = 1 if self.pass_label == SUBTRACTED else 0
        B, T, F = pre.shape
        P, device = len(self.passes()), pre.device
        self.sum_all, self.sum_0 = _grow(self.sum_all, (P, F), device), _grow(self.sum_0, (P, F), device)
        self.sq_all, self.sq_0 = _grow(self.sq_all, (P, F, F), device), _grow(self.sq_0, (P, F, F), device)
        x = pre.detach().to(self.sum_all.dtype)  # (B, T, F)
        flat = x.reshape(B * T, F)
        self.sum_all[k] += flat.sum(0)
        self.sq_all[k] += flat.T @ flat  # (F, F)
        x0 = x[:, 0]  # (B, F)
        self.sum_0[k] += x0.sum(0)
        self.sq_0[k] += x0.T @ x0
        self.count[k, 0] += B * T
        self.count[k, 1] += B
        # the scatter sample: every position 0, evenly spaced others of the first windows
        seen = int(self.windows[k])
        window = torch.arange(seen, seen + B)  # (B,) window numbers in this share, on the host
        self.sample.add(k, x0, window, torch.zeros(B, dtype=torch.int64))
        room = max(0, self.scatter_windows - seen)
        if room and T > 1 and self.scatter_positions:
            positions = torch.unique(torch.linspace(1, T - 1, min(self.scatter_positions, T - 1)).round().long())
            chosen = x[:room][:, positions.to(device)]  # (b, p, F)
            b = chosen.shape[0]
            self.sample.add(k, chosen.reshape(-1, F), window[:b].repeat_interleave(len(positions)),
                            positions.repeat(b))
        self.windows[k] += B

    def pca(self, k: int) -> dict | None:
        """The fitted PCA of pass ``k``: eigenvectors, explained shares, the separation score."""
        if self.sum_all.numel() == 0 or int(self.count[k, 0]) == 0:
            return None
        n, n0 = int(self.count[k, 0]), int(self.count[k, 1])
        s, q = self.sum_all[k].cpu().double(), self.sq_all[k].cpu().double()
        s0, q0 = self.sum_0[k].cpu().double(), self.sq_0[k].cpu().double()
        mu = s / n
        cov = q / n - torch.outer(mu, mu)
        values, vectors = torch.linalg.eigh(cov)  # ascending
        v1, v2 = vectors[:, -1], vectors[:, -2] if vectors.shape[1] > 1 else vectors[:, -1]
        no = n - n0
        m0 = s0 / n0
        mo = (s - s0) / max(no, 1)
        cov_o = (q - q0) / max(no, 1) - torch.outer(mo, mo)
        gap = float(v1 @ (m0 - mo))
        if gap < 0:
            v1, gap = -v1, -gap
        if float(v2 @ (m0 - mo)) < 0:
            v2 = -v2
        sd = math.sqrt(max(float(v1 @ cov_o @ v1), 0.0))
        trace = float(values.clamp_min(0).sum())
        # the same score along each of the leading TOP_PCS components: where position 0 separates best
        top = vectors[:, -TOP_PCS:].flip(1)  # (F, k) leading first
        gaps = (top.T @ (m0 - mo)).abs()  # (k,)
        sds = torch.einsum("fk,fg,gk->k", top, cov_o, top).clamp_min(0).sqrt()
        scores = torch.where(sds > 0, gaps / sds.clamp_min(1e-300), torch.full_like(gaps, math.inf))
        best = int(torch.argmax(scores))
        return {"mu": mu, "v1": v1, "v2": v2, "separation": gap / sd if sd > 0 else math.inf,
                "best": float(scores[best]), "best_pc": best + 1,
                "pc1": float(values[-1]) / trace if trace > 0 else math.nan,
                "pc2": float(values[-2]) / trace if trace > 0 and len(values) > 1 else math.nan, "n": n}

    def label(self, k: int) -> str:
        return "+".join(f"{self.layer}.{h}" for h in self.targets) if k else "none"

    def rows(self) -> list[Row]:
        rows: list[Row] = []
        for k in range(len(self.passes())):
            fit = self.pca(k)
            if fit is None:
                continue
            cond = (("subtracted", self.label(k)),)
            n = fit["n"]
            rows += [Row(self.name, "pca_separation", self.layer, None, fit["separation"], n, cond),
                     Row(self.name, "pca_explained_pc1", self.layer, None, fit["pc1"], n, cond),
                     Row(self.name, "pca_explained_pc2", self.layer, None, fit["pc2"], n, cond),
                     Row(self.name, "pca_separation_best", self.layer, None, fit["best"], n, cond),
                     Row(self.name, "pca_separation_best_pc", self.layer, None, float(fit["best_pc"]), n, cond)]
            sample = self.sample.get(k)
            if sample is None:
                continue
            x, window, pos = sample
            # the other positions of the first scatter_windows windows overall (merged shares each kept
            # their own first windows' points; after the merge the numbering is global)
            keep = (pos == 0) | (window < self.scatter_windows)
            x, window, pos = x[keep], window[keep], pos[keep]
            centred = x.double() - fit["mu"]
            pc1, pc2 = (centred @ fit["v1"]).tolist(), (centred @ fit["v2"]).tolist()
            for i, (a, b, w, t) in enumerate(zip(pc1, pc2, window.tolist(), pos.tolist())):
                point = (*cond, ("point", i), ("window", int(w)), ("position", int(t)))
                rows += [Row(self.name, "pca_scatter_pc1", self.layer, None, a, 1, point),
                         Row(self.name, "pca_scatter_pc2", self.layer, None, b, 1, point)]
        return rows


@register_probe("mlp_pca", params=_PCA_PARAMS, metrics=_pca_metrics("hook_pre"))
class MlpPca(_MlpPca):
    """PCA of the MLP's pre-activation (``mlp.hook_pre``: the activation's input), position 0 marked."""

    @observes(hooks.MLP_PRE)
    def pre(self, layer: int, value: Tensor) -> None:
        self._observe(layer, value)


@register_probe("mlp_pca_up", params=_PCA_PARAMS, metrics=_pca_metrics("hook_pre_linear"))
class MlpPcaUp(_MlpPca):
    """PCA of a gated MLP's up projection (``mlp.hook_pre_linear``, seed 003's choice), position 0 marked."""

    @observes(hooks.MLP_PRE_LINEAR)
    def pre(self, layer: int, value: Tensor) -> None:
        self._observe(layer, value)


# ---- outlier channels at position 0 -----------------------------------------------------------------

WHERE = {hooks.RESID_PRE: "resid_pre", hooks.LN1_NORMALIZED: "normed"}


@register_probe(
    "p0_outliers",
    params=(Param("top", int, 5, "channels reported per layer and place",
                  check=lambda v: None if v >= 1 else "must be at least 1"),),
    metrics={
        "p0_outlier_z": MetricInfo(
            "Position-0 outlier channel z-score", "z",
            "z_c = (mean_w x[w,0,c] - mean_{w,t>=1} x[w,t,c]) / std_{w,t>=1} x[w,t,c] of the rank-th channel by |z|; "
            "where = resid_pre (before the first pre-norm) or normed (ln1.hook_normalized, after it)",
            "SPEC.md 'The position-zero circuit'; seed 003 §3.1 (Sun et al. 2024)",
            "large |z| = a channel that marks position 0", per="layer x rank"),
        "p0_outlier_channel": MetricInfo(
            "Position-0 outlier channel", "channel index", "the channel of that rank", "seed 003 §3.1", "",
            per="layer x rank"),
        "p0_outlier_max_z": MetricInfo(
            "Largest position-0 |z|", "|z|", "max over channels of |z_c| per layer (where column)", "seed 003 §3.1",
            "higher = position 0 has a more extreme channel", per="layer"),
    },
)
class P0Outliers(_LazyTensors):
    """Channels whose position-0 value stands out from the other positions, before and after the pre-norm."""

    top: int

    def setup(self) -> None:
        empty = torch.zeros(0, dtype=torch.float64)
        # (2 places, L, C): sums at position 0; sums and squares over the others
        self.s0, self.so, self.qo = empty.clone(), empty.clone(), empty.clone()
        self.count = torch.zeros(2, self.spec.n_layers, 2, dtype=torch.int64)  # (place, L, [windows, others])

    def _add(self, place: int, layer: int, x: Tensor) -> None:  # (B, T, C)
        B, T, C = x.shape
        shape = (2, self.spec.n_layers, C)
        self.s0, self.so, self.qo = (_grow(t, shape, x.device) for t in (self.s0, self.so, self.qo))
        x = x.detach().to(self.s0.dtype)
        self.s0[place, layer] += x[:, 0].sum(0)
        rest = x[:, 1:].reshape(-1, C)
        self.so[place, layer] += rest.sum(0)
        self.qo[place, layer] += rest.square().sum(0)
        self.count[place, layer, 0] += B
        self.count[place, layer, 1] += B * (T - 1)

    @observes(hooks.RESID_PRE)
    def before(self, layer: int, value: Tensor) -> None:
        self._add(0, layer, value)

    @observes(hooks.LN1_NORMALIZED)
    def after(self, layer: int, value: Tensor) -> None:
        self._add(1, layer, value)

    def z_scores(self, place: int, layer: int) -> Tensor | None:
        n0, no = int(self.count[place, layer, 0]), int(self.count[place, layer, 1])
        if n0 == 0 or no == 0:
            return None
        eps = torch.finfo(self.s0.dtype).eps * 64  # round-off of the accumulated sums, with room
        m0 = self.s0[place, layer].cpu().double() / n0
        mo = self.so[place, layer].cpu().double() / no
        square = self.qo[place, layer].cpu().double() / no
        var = square - mo.square()
        var = torch.where(var <= eps * square, torch.zeros_like(var), var)  # constant over the others
        diff = m0 - mo
        diff = torch.where(diff.abs() <= eps * (m0.abs() + mo.abs()), torch.zeros_like(diff), diff)
        z = diff / var.sqrt()  # a channel constant over the others (force-sink's reserved ones): +-inf
        return torch.where(torch.isnan(z), torch.zeros_like(z), z)  # 0 / 0: the channel does not differ

    def rows(self) -> list[Row]:
        rows: list[Row] = []
        if self.s0.numel() == 0:
            return rows
        for place, where in enumerate(WHERE.values()):
            for layer in range(self.spec.n_layers):
                z = self.z_scores(place, layer)
                if z is None:
                    continue
                n = int(self.count[place, layer, 0])
                order = torch.argsort(z.abs(), descending=True, stable=True)[:self.top]
                rows.append(Row(self.name, "p0_outlier_max_z", layer, None, float(z.abs().max()), n,
                                (("where", where),)))
                for rank, c in enumerate(order.tolist(), start=1):
                    cond = (("where", where), ("rank", rank))
                    rows += [Row(self.name, "p0_outlier_z", layer, None, float(z[c]), n, cond),
                             Row(self.name, "p0_outlier_channel", layer, None, float(c), n, cond)]
        return rows


# ---- BOS experiments ----------------------------------------------------------------------------------


@register_probe(
    "bos_experiment",
    params=(
        Param("bos_id", int, None, "the BOS token id (None: only the without-BOS setting)", optional=True),
        Param("repeats", tuple, (1, 2, 4, 8), "how many times the first token is repeated", check=_check_repeats),
        Param("epsilon", float, 0.3, "Gu et al.'s threshold eps on alpha_0",
              check=lambda v: None if 0.0 < v < 1.0 else "must lie in (0, 1)"),
        Param("layer_start", int, 2, "first layer of the bos_sink_rate_from_layer row (None: no such row)",
              check=lambda v: None if v >= 0 else "must be at least 0", optional=True),
    ),
    metrics={
        "bos_sink_rate": MetricInfo(
            "Sink rate with / without BOS", "fraction of heads",
            "Sink_0^eps on [BOS] + K (bos = with) and on K (bos = without), K the window's content; per head the "
            "fraction of windows in which alpha_0 > eps", "SPEC.md 'The position-zero circuit'; seed 003 Table 1(a)",
            "higher = more heads sink on position 0"),
        "bos_sink_rate_from_layer": MetricInfo(
            "Sink rate with / without BOS, from a layer on", "fraction of heads",
            "bos_sink_rate restricted to layers l >= s, s in the layer_start column (default 2)",
            "seed 003 Table 1(a) (Sink_0^eps[2:])", "", per="model"),
        "bos_repeat_loss": MetricInfo(
            "Loss with the first token repeated", "nats / token",
            "mean next-token cross-entropy over the targets K[1:] only, with [BOS] x r + K (with) or K_0 x r + K[1:] "
            "(without); repeat column = r", "seed 003 Table 1(b)", "", per="model"),
        "bos_repeat_loss_delta": MetricInfo(
            "Loss change from repeating the first token", "nats / token", "bos_repeat_loss(r) - bos_repeat_loss(1)",
            "seed 003 Table 1(b)", "smaller = position 0 a more stable 'semantic vacuum'", per="model"),
    },
)
class BosExperiment(_LazyTensors):
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
        self.hits = {s: HeadMeans(self.spec.n_layers, self.spec.n_heads) for s in self.settings}

    def _accumulators(self) -> dict:
        """Declared here (this class loads, rolls back and merges them itself), keyed as ever: hits_with, ..."""
        return {"loss_sum": self.loss_sum, "loss_n": self.loss_n, **{f"hits_{s}": acc for s, acc in self.hits.items()}}

    def load_state_dict(self, state: dict) -> None:
        for s, acc in self.hits.items():
            acc.load_state_dict(state[f"hits_{s}"])
        self.loss_sum, self.loss_n = state["loss_sum"].clone(), state["loss_n"].clone()

    def snapshot(self) -> dict:
        return {"loss_sum": self.loss_sum.clone(), "loss_n": self.loss_n.clone(),
                "hits": {s: copy.deepcopy(a) for s, a in self.hits.items()}}

    def restore(self, snapshot: dict) -> None:
        self.loss_sum, self.loss_n, self.hits = snapshot["loss_sum"], snapshot["loss_n"], snapshot["hits"]

    def merge(self, other: "BosExperiment") -> None:
        for s, acc in self.hits.items():
            acc.merge(other.hits[s])
        self.loss_sum = self.loss_sum + other.loss_sum.to(self.loss_sum.device)
        self.loss_n = self.loss_n + other.loss_n.to(self.loss_n.device)

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
            rows += [Row(r.probe, r.metric, r.layer, r.head, r.value, r.n, cond)
                     for r in self.hits[setting].rows(self.name, "bos_sink_rate")]
            if self.layer_start is not None:
                late = [l for l in self.spec.attention_layers if l >= self.layer_start]
                start = cond + (("layer_start", self.layer_start),)
                rows += [Row(self.name, "bos_sink_rate_from_layer", None, None, r.value, r.n, start)
                         for r in self.hits[setting].rows(self.name, "bos_sink_rate", layers=late) if r.layer is None]
        sums, counts = self.loss_sum.cpu(), self.loss_n.cpu()
        for setting in self.settings:
            base = self.labels.index(f"{setting}-bos-r1")
            for r in self.r:
                i = self.labels.index(f"{setting}-bos-r{r}")
                n = int(counts[i])
                if n == 0:
                    continue
                value = float(sums[i] / counts[i])
                cond = (("bos", setting), ("repeat", r))
                rows += [Row(self.name, "bos_repeat_loss", None, None, value, n, cond),
                         Row(self.name, "bos_repeat_loss_delta", None, None,
                             value - float(sums[base] / counts[base]), n, cond)]
        return rows
