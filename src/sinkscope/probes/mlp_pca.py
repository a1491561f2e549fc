"""PCA of one layer's MLP pre-activation with position 0 marked, optionally without chosen heads
(SPEC.md "The position-zero circuit"; the P0-sink study, §3.2 Fig. 3).

One of the position-zero circuit's probes, which ``sinkscope circuit`` runs together
(``commands/circuit.py``). It reads only named hook points (``capture/hooks.py``), so it runs on
every Hugging Face family and on the trainer's own model alike.

``mlp_pca`` / ``mlp_pca_up`` (``mlp.hook_pre`` / ``mlp.hook_pre_linear`` of one layer, 0 by
default; ``commands/circuit.py`` takes the up projection, ``hook_pre_linear``, on gated MLPs as
the P0-sink study does, ``hook_pre`` elsewhere): PCA over every position of every window from a
streaming second moment X^T X (float64) with the sums of x and of position 0's x; position 0's rows
themselves are kept (the scatter sample holds every one), so the others' moments are the total's less
theirs. The second moment is held exactly (F^2 per pass, F = the MLP width) when that fits the
budget, else as a Frequent Directions sketch (``stats/sketch.py``; issue 56, item 3) whose error
bound is reported (``pca_sketch_bound``); the way and its memory are decided and printed before
anything F wide is allocated, and a way that does not fit is one sentence (``probes/pca_memory.py``).
With ``heads`` (``LAYER.HEAD``, heads of the PCA layer only) a second pass zeroes
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
import sys

import torch
from torch import Tensor

from sinkscope.capture import hooks
from sinkscope.errors import SinkscopeError, check_heads, option
from sinkscope.probes.base import Accumulator, LazyTensors, Param, grow, intervenes, observes, register_probe
from sinkscope.probes.pca_memory import CHUNK_ROWS, COVARIANCE_CHOICES, CovariancePlan, plan_covariance
from sinkscope.stats.sketch import FrequentDirections
from sinkscope.store.results import MetricInfo, Row

SUBTRACTED = "subtracted"
#: leading components searched by pca_separation_best.
TOP_PCS = 10
#: the sketch's default l (pca_memory.py; the crossover measured in docs/commands/circuit.md).
SKETCH_RANK = 256


def _to_stderr(message: str) -> None:
    print(message, file=sys.stderr)


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
        kept = x.detach().to(torch.promote_types(x.dtype, torch.float32)).clone()  # float64 stays float64
        self.parts.setdefault(k, []).append((kept, window, pos))

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
    Param("covariance", str, "auto", "exact (F^2 float64 sums), sketch (Frequent Directions, bounded error) or auto "
          "(exact when it fits the budget)", choices=COVARIANCE_CHOICES),
    Param("memory_gb", float, 0.0, "the budget of the covariance, GB (0: half the memory free on the device)",
          check=lambda v: None if v >= 0 else "must be at least 0"),
    Param("sketch_rank", int, SKETCH_RANK, "rows l a sketch keeps (at most 2 l; the error bound falls as 1 / l)",
          check=lambda v: None if v >= 16 else "must be at least 16"),
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
        "pca_sketch_bound": MetricInfo(
            "Sketch error bound", "share of PC1's variance",
            "the most the covariance's sketch can understate the variance along any direction (Frequent Directions: "
            "the summed shrinks over n), over PC1's eigenvalue; 0 when the covariance is exact",
            "Ghashami et al. 2016, Frequent Directions (sinkscope, issue 56)", "lower = closer to exact", per="layer"),
        "pca_scatter_pc1": MetricInfo(
            "Scatter sample, PC1", "PC1 coordinate",
            "PC1 coordinate of a sampled point (every position 0; evenly spaced other positions of the first "
            "windows); point and position columns", "the P0-sink study, Fig. 3", "", per="point"),
        "pca_scatter_pc2": MetricInfo(
            "Scatter sample, PC2", "PC2 coordinate", "PC2 coordinate of the same point", "the P0-sink study, Fig. 3", "",
            per="point"),
    }


class _Sketches(Accumulator):
    """Per pass, two Frequent Directions sketches (``stats/sketch.py``): the rows of positions >= 1 and of position 0.

    Their tensors are replaced, never changed in place, so a snapshot shares them; merging folds the
    other share's rows in (the error bounds add).
    """

    def __init__(self, rank: int):
        self.rank = rank
        self.parts: dict[int, dict[str, FrequentDirections]] = {}

    def add(self, k: int, part: str, rows: Tensor) -> None:
        if rows.shape[0]:
            self.parts.setdefault(k, {}).setdefault(part, FrequentDirections(self.rank)).add(rows)

    def get(self, k: int, part: str) -> FrequentDirections | None:
        return self.parts.get(k, {}).get(part)

    def any(self) -> bool:
        return bool(self.parts)

    def state_dict(self) -> dict:
        return {k: {part: {"rows": fd.rows.detach().cpu().clone(),
                           "shrunk": torch.tensor(fd.bound(), dtype=torch.float64)}
                    for part, fd in parts.items()} for k, parts in self.parts.items()}

    def load_state_dict(self, state: dict) -> None:
        self.parts = {k: {part: FrequentDirections(self.rank, v["rows"].clone(), float(v["shrunk"]))
                          for part, v in parts.items()} for k, parts in state.items()}

    def merge(self, other: "_Sketches") -> None:
        for k, parts in other.parts.items():
            for part, fd in parts.items():
                mine = self.get(k, part)
                if mine is None:
                    self.parts.setdefault(k, {})[part] = FrequentDirections(self.rank, fd.rows, fd.shrunk)
                else:
                    mine.merge(fd)

    def snapshot(self) -> "_Sketches":
        out = _Sketches(self.rank)
        out.parts = {k: {part: FrequentDirections(self.rank, fd.rows, fd.shrunk) for part, fd in parts.items()}
                     for k, parts in self.parts.items()}
        return out


class _MlpPca(LazyTensors):
    """PCA of one layer's MLP pre-activation, position 0 marked, optionally without chosen heads."""

    layer: int
    heads: tuple
    scatter_positions: int
    scatter_windows: int
    covariance: str
    memory_gb: float
    sketch_rank: int
    not_state = ("plan", "announce")

    def setup(self) -> None:
        self.targets = parse_subtracted(self.heads, self.layer, self.spec.n_heads)
        empty = torch.zeros(0, dtype=torch.float64)
        self.sum_all, self.sum_0, self.sq_diag = empty.clone(), empty.clone(), empty.clone()  # (P, F) each
        self.sq_all = empty.clone()  # (P, F, F): the exact second moment, or empty when sketched
        self.sketch = _Sketches(self.sketch_rank)
        self.count = torch.zeros(2, 2, dtype=torch.int64)  # (pass, [all, position 0])
        self.windows = torch.zeros(2, dtype=torch.int64)  # windows seen per pass (scatter budget)
        self.sample = _Sample()
        self.plan: CovariancePlan | None = None
        self.announce = _to_stderr

    def prepare(self, device: torch.device, log) -> None:
        """Plan (and state) the covariance's memory before the first window when the MLP width is known."""
        self.announce = log
        if self.spec.mlp_width and not (self.sq_all.numel() or self.sketch.any()):
            self._plan(self.spec.mlp_width, device)

    def passes(self) -> tuple[str | None, ...]:
        return (None, SUBTRACTED) if self.targets else (None,)

    def _plan(self, width: int, device: torch.device) -> CovariancePlan:
        """The plan for ``width`` (made once, stated once), or one sentence when it does not fit."""
        if self.plan is None or self.plan.width != width:
            self.plan = plan_covariance(self.name, self.layer, width, len(self.passes()), rank=self.sketch_rank,
                                        scatter_windows=self.scatter_windows,
                                        scatter_positions=self.scatter_positions, choice=self.covariance,
                                        memory_gb=self.memory_gb, device=device)
            self.announce(self.plan.statement())
        return self.plan

    def method(self) -> str | None:
        """``"exact"`` or ``"sketch"``: what the state holds (a resumed or merged run keeps its way), else the plan's."""
        if self.sq_all.numel():
            return "exact"
        if self.sketch.any():
            return "sketch"
        return None if self.plan is None else self.plan.method

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
        held = self.sq_all.numel() or self.sketch.any()  # a resumed or merged state keeps its way
        method = self.method() if held else self._plan(F, device).method  # it must fit, or one sentence
        self.sum_all, self.sum_0 = grow(self.sum_all, (P, F), device), grow(self.sum_0, (P, F), device)
        self.sq_diag = grow(self.sq_diag, (P, F), device)
        if method == "exact":
            self.sq_all = grow(self.sq_all, (P, F, F), device)
        dtype = self.sum_all.dtype
        for b in range(B):  # CHUNK_ROWS positions at a time in float64 (pca_memory.py)
            for start in range(0, T, CHUNK_ROWS):
                rows = pre[b, start:start + CHUNK_ROWS].detach().to(dtype)  # (t, F)
                self.sum_all[k] += rows.sum(0)
                self.sq_diag[k] += (rows * rows).sum(0)
                if method == "exact":
                    self.sq_all[k].addmm_(rows.T, rows)
                else:
                    self.sketch.add(k, "others", rows[1:] if start == 0 else rows)
                    if start == 0:
                        self.sketch.add(k, "zero", rows[:1])
        x0 = pre[:, 0].detach()  # (B, F)
        self.sum_0[k] += x0.to(dtype).sum(0)
        self.count[k, 0] += B * T
        self.count[k, 1] += B
        # the scatter sample: every position 0, evenly spaced others of the first windows
        seen = int(self.windows[k])
        window = torch.arange(seen, seen + B)  # (B,) window numbers in this share, on the host
        self.sample.add(k, x0, window, torch.zeros(B, dtype=torch.int64))
        room = max(0, self.scatter_windows - seen)
        if room and T > 1 and self.scatter_positions:
            positions = torch.unique(torch.linspace(1, T - 1, min(self.scatter_positions, T - 1)).round().long())
            chosen = pre[:room][:, positions.to(device)].detach()  # (b, p, F)
            b = chosen.shape[0]
            self.sample.add(k, chosen.reshape(-1, F), window[:b].repeat_interleave(len(positions)),
                            positions.repeat(b))
        self.windows[k] += B

    def _zero_rows(self, k: int) -> Tensor:
        """Position 0's rows of pass ``k`` (n0, F), float64, from the scatter sample (which keeps every one)."""
        x, _, pos = self.sample.get(k)
        return x[pos == 0].double()

    def _to_sketch(self) -> None:
        """Turn exact sums into the sketches (merging with a share that sketched): the others' second moment
        X_o^T X_o = X^T X - X_0^T X_0 as the rows sqrt(lambda_i) v_i^T of its eigendecomposition."""
        for k in range(self.sq_all.shape[0]):
            if int(self.count[k, 0]) == 0:
                continue
            zero = self._zero_rows(k).to(self.sq_all)
            values, vectors = torch.linalg.eigh(self.sq_all[k] - zero.T @ zero)  # (F,), (F, F)
            self.sketch.add(k, "others", (vectors * values.clamp_min(0).sqrt()).T.flip(0))
            self.sketch.add(k, "zero", zero)
        self.sq_all = torch.zeros(0, dtype=self.sq_all.dtype)

    def merge(self, other: "_MlpPca") -> None:
        """Shares that took different ways (their free memory differed) meet as sketches."""
        if self.sq_all.numel() and other.sketch.any():
            self._to_sketch()
        if other.sq_all.numel() and self.sketch.any():
            other._to_sketch()
        super().merge(other)

    def pca(self, k: int) -> dict | None:
        """The fitted PCA of pass ``k``: eigenvectors, explained shares, the separation score, the sketch's bound.

        Exact: the eigendecomposition of C = X^T X / n - mu mu^T. Sketched: C ~ (B_o^T B_o + B_0^T B_0) / n
        - mu mu^T, supported on the span of the sketches' rows and mu, so its eigenpairs come from that
        basis Q exactly: eig(Q^T C Q). The trace (explained shares) is exact either way: sum_f of the
        channels' sums of squares / n - |mu|^2. Along a direction v the others' variance is
        (v^T X_o^T X_o v) / n_o - (v^T m_o)^2, with v^T X_o^T X_o v = v^T X^T X v - |X_0 v|^2 (exact) or
        |B_o v|^2 (sketched: understated by at most the others' sketch bound).
        """
        if self.sum_all.numel() == 0 or int(self.count[k, 0]) == 0:
            return None
        n, n0 = int(self.count[k, 0]), int(self.count[k, 1])
        no = n - n0
        s, s0 = self.sum_all[k].double(), self.sum_0[k].double()
        mu, m0, mo = s / n, s0 / n0, (s - s0) / max(no, 1)
        if self.method() == "exact":
            q = self.sq_all[k].double()  # (F, F)
            cov = torch.addr(q, mu, mu, beta=1.0 / n, alpha=-1.0)  # (F, F)
            values, vectors = torch.linalg.eigh(cov)  # ascending
            del cov
            trace = float(values.clamp_min(0).sum())
            zero = self._zero_rows(k).to(q)  # (n0, F)

            def others_moment(v: Tensor) -> Tensor:  # (F, j) -> (j,)
                return (v * (q @ v)).sum(0) - (zero @ v).pow(2).sum(0)
            bound = 0.0
        else:
            others, zero_fd = self.sketch.get(k, "others"), self.sketch.get(k, "zero")
            b_o = others.rows.double() if others is not None else mu.new_zeros(0, mu.shape[0])  # (m_o, F)
            b_0 = zero_fd.rows.double()  # (m_0, F)
            basis, _ = torch.linalg.qr(torch.cat([b_o, b_0, mu[None]]).T)  # (F, r)
            c, p_o, p_0 = basis.T @ mu, b_o @ basis, b_0 @ basis  # (r,), (m_o, r), (m_0, r)
            small = (p_o.T @ p_o + p_0.T @ p_0) / n - torch.outer(c, c)  # (r, r)
            values, w = torch.linalg.eigh(small)  # ascending
            vectors = basis @ w  # (F, r)
            trace = float(self.sq_diag[k].double().sum() / n - mu @ mu)

            def others_moment(v: Tensor) -> Tensor:  # (F, j) -> (j,)
                return (b_o @ v).pow(2).sum(0)
            bound = ((others.bound() if others is not None else 0.0) + zero_fd.bound()) / n
        v1, v2 = vectors[:, -1], vectors[:, -2] if vectors.shape[1] > 1 else vectors[:, -1]
        gap = float(v1 @ (m0 - mo))
        if gap < 0:
            v1, gap = -v1, -gap
        if float(v2 @ (m0 - mo)) < 0:
            v2 = -v2
        # the same score along each of the leading TOP_PCS components: where position 0 separates best
        top = vectors[:, -TOP_PCS:].flip(1)  # (F, j) leading first
        gaps = (top.T @ (m0 - mo)).abs()  # (j,)
        sds = (others_moment(top) / max(no, 1) - (top.T @ mo).pow(2)).clamp_min(0).sqrt()  # (j,)
        scores = torch.where(sds > 0, gaps / sds.clamp_min(1e-300), torch.full_like(gaps, math.inf))
        best = int(torch.argmax(scores))
        sd = float(sds[0])
        lead = float(values[-1])
        return {"mu": mu.cpu(), "v1": v1.cpu(), "v2": v2.cpu(), "separation": gap / sd if sd > 0 else math.inf,
                "best": float(scores[best]), "best_pc": best + 1,
                "pc1": lead / trace if trace > 0 else math.nan,
                "pc2": float(values[-2]) / trace if trace > 0 and len(values) > 1 else math.nan, "n": n,
                "bound": bound / lead if lead > 0 else (0.0 if bound == 0 else math.inf)}

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
                     Row(self.name, "pca_separation_best_pc", self.layer, None, float(fit["best_pc"]), n, cond),
                     Row(self.name, "pca_sketch_bound", self.layer, None, fit["bound"], n, cond)]
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
