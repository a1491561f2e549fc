"""PCA of one layer's MLP pre-activation with position 0 marked, optionally without chosen heads
(SPEC.md "The position-zero circuit"; the P0-sink study, §3.2 Fig. 3).

One of the position-zero circuit's probes, which ``sinkscope circuit`` runs together
(``commands/circuit.py``). It reads only named hook points (``capture/hooks.py``), so it runs on
every Hugging Face family and on the trainer's own model alike.

``mlp_pca`` / ``mlp_pca_up`` (``mlp.hook_pre`` / ``mlp.hook_pre_linear`` of one layer, 0 by
default; ``commands/circuit.py`` takes the up projection, ``hook_pre_linear``, on gated MLPs as
the P0-sink study does, ``hook_pre`` elsewhere): PCA over every position of every window from a
streaming covariance (float64 sums of x and x x^T, kept apart for position 0 and the rest:
memory 2 F^2 doubles per pass, F = the MLP width; nothing grows with the windows but the
scatter sample; sums that would not fit in the free memory are refused in one sentence before they are
allocated, :func:`check_covariance_fits`). With ``heads`` (``LAYER.HEAD``, heads of the PCA layer only) a second pass zeroes
those heads at ``hook_z``: at the PCA layer this removes exactly ``hook_result[..., h, :]`` from
the residual stream the MLP reads (the heads' outputs add into it; nothing else in the layer
depends on them), so the pre-activation is that of the residual without those heads. The PCA is
fitted again on that pass. ``pca_separation = |mean PC1(position 0) - mean PC1(others)| /
std PC1(others)`` (population std); PC1's sign is chosen so the position-0 mean is >= its
others' mean. ``pca_separation_best`` is the largest of the same score along each of the 10 leading
components (``pca_separation_best_pc`` says which). The scatter sample (bounded): position 0 of *every* window, plus
``scatter_positions`` evenly spaced positions >= 1 of the first ``scatter_windows`` windows; its
PC1/PC2 coordinates are rows with ``point`` and ``position`` columns.

The two probes are one measurement read at two hook points (the same class, parameters and
metrics but for the point observed), so they share this module, as ``massive_topk`` and
``massive_intervention`` share theirs.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

from sinkscope.capture import hooks
from sinkscope.errors import SinkscopeError, check_heads, option
from sinkscope.probes.base import Accumulator, LazyTensors, Param, grow, intervenes, observes, register_probe
from sinkscope.store.results import MetricInfo, Row

SUBTRACTED = "subtracted"
#: leading components searched by pca_separation_best.
TOP_PCS = 10


def parse_subtracted(heads, layer: int, n_heads: int) -> list[int]:
    """``("0.3", "0.1")`` -> ``[1, 3]``: heads of the PCA layer; any other layer is one sentence."""
    out: set[int] = set()
    for item in heads:
        l, h = (int(x) for x in str(item).split("."))
        if l != layer:
            raise SinkscopeError(f"{option('subtract_head')} {item}: the layer-{layer} MLP reads only layer {layer}'s heads "
                                 f"(and the layers before, whose heads change everything after them); "
                                 f"give heads {layer}.0 to {layer}.{n_heads - 1}.")
        if not 0 <= h < n_heads:
            raise SinkscopeError(f"{option('subtract_head')} {item}: the model has heads 0 to {n_heads - 1}.")
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
          check=check_heads),
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
            "SPEC.md 'The position-zero circuit'; the P0-sink study, §3.2 Fig. 3", "higher = position 0 separates", per="layer"),
        "pca_separation_best": MetricInfo(
            "Position-0 separation along its best leading PC", "std of the others",
            f"the same score along each of the {TOP_PCS} leading components; the largest (a sinkscope addition: "
            "PC1 of a content-dominated layer can miss a direction that isolates position 0)",
            "the P0-sink study, §3.2 (sinkscope's extension)", "higher = position 0 separates", per="layer"),
        "pca_separation_best_pc": MetricInfo(
            "Which PC separates position 0 best", "component (1 = PC1)",
            f"the index among the {TOP_PCS} leading components of pca_separation_best", "sinkscope", "", per="layer"),
        "pca_explained_pc1": MetricInfo(
            "Variance explained by PC1", "share", f"PC1's eigenvalue over the trace of {where}'s covariance",
            "the P0-sink study, §3.2", "", per="layer"),
        "pca_explained_pc2": MetricInfo(
            "Variance explained by PC2", "share", f"PC2's eigenvalue over the trace of {where}'s covariance",
            "the P0-sink study, §3.2", "", per="layer"),
        "pca_scatter_pc1": MetricInfo(
            "Scatter sample, PC1", "PC1 coordinate",
            "PC1 coordinate of a sampled point (every position 0; evenly spaced other positions of the first "
            "windows); point and position columns", "the P0-sink study, Fig. 3", "", per="point"),
        "pca_scatter_pc2": MetricInfo(
            "Scatter sample, PC2", "PC2 coordinate", "PC2 coordinate of the same point", "the P0-sink study, Fig. 3", "",
            per="point"),
    }


def covariance_bytes(width: int, passes: int) -> int:
    """What the streaming covariance holds: two (F, F) float64 sums (every position, position 0) per pass."""
    return 2 * passes * width * width * 8


def _free_bytes(device: torch.device) -> int | None:
    if device.type == "cuda":
        return int(torch.cuda.mem_get_info(device)[0])
    from sinkscope.runtime.memory import available_memory

    return available_memory()


def check_covariance_fits(probe: str, width: int, passes: int, device: torch.device, free: int | None = None) -> None:
    """One sentence, before the sums are allocated, when they would not fit in the memory free on ``device``
    (issue 56: a 70B model's F = 28,672 needs 13 GB per pass; a run killed out of memory keeps nothing)."""
    needed = covariance_bytes(width, passes)
    free = _free_bytes(device) if free is None else free
    if free is None or needed <= free:
        return
    raise SinkscopeError(f"{probe} keeps {2 * passes} float64 covariance sums of {width:,} x {width:,} (the MLP width), "
                         f"{needed / 1e9:.1f} GB, more than the {free / 1e9:.1f} GB free on {device}; run it on a "
                         f"machine with more memory, or leave {probe} out (sinkscope measure with the circuit's other "
                         "probes).")


class _MlpPca(LazyTensors):
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
        if self.sq_all.numel() == 0:  # before the F x F sums exist: they must fit, or one sentence
            check_covariance_fits(self.name, F, P, device)
        self.sum_all, self.sum_0 = grow(self.sum_all, (P, F), device), grow(self.sum_0, (P, F), device)
        self.sq_all, self.sq_0 = grow(self.sq_all, (P, F, F), device), grow(self.sq_0, (P, F, F), device)
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
    """PCA of a gated MLP's up projection (``mlp.hook_pre_linear``, the P0-sink study's choice), position 0 marked."""

    @observes(hooks.MLP_PRE_LINEAR)
    def pre(self, layer: int, value: Tensor) -> None:
        self._observe(layer, value)
