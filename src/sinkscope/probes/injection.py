"""Value-read injection: the loss increase from junk added to the quiet reads (SPEC.md "Value-read injection").

Per batch the probe takes part in one clean forward pass and one more per condition and draw
(junk type x cutoff x dose x draw). In a condition's pass, at every attention layer, for every
value (KV) head and window, before the attention mixes the values and before any value gate
(``blocks.{l}.attn.hook_v``)::

    n_j = ||v~_j||                                  clean read norms over the window's S keys
    c   = quantile(n, 0.5 | 0.25)                   cutoff (numpy's linear quantile)
    m_h = median(n)                                 the head's median clean read norm
    v_j <- v_j + eps * m_h * u_j   for every j with n_j < c (strict); other reads untouched

    loss_clean = mean next-token cross-entropy over every window and position (clean pass)
    loss       = the same under corruption, averaged over the K draws
    loss_delta = loss - loss_clean  (nats / token)

``v~_j`` is the read layer l receives in the clean forward pass of the same batch, ``v_j`` the one it
receives in the corrupted pass (which already carries the junk injected below l). With
``junk_source="corrupted"`` (the protocol before 2026-12) the quiet set, m_h and transplanted junk
come from ``v_j`` itself instead.

Junk ``u_j`` (unit length), drawn from the clean reads ``v~`` (SPEC.md "Resolved (2026-12)"):

- ``structured``: the normalised read of the same KV head at a uniformly random *other* position
  of the evaluation batch (any window, never (window, position) itself; almost always another
  window); drawn independently per read and head;
- ``same-context``: the same from a uniformly random other position of the same window;
- ``gaussian``: an isotropic normal vector, normalised;
- ``random-direction``: one random unit vector per KV head, shared by every corrupted read of the batch;
- ``own-direction``: the head's projection-gate direction w_h / ||w_h|| (the trainer's
  ``projgate`` and ``sink+proj``; read from the checkpoint given as ``directions``).

Uncertainty (``draws`` = K seeded draws of the junk). With ``x_w`` a window's mean cross-entropy
over its T - 1 predictions, and ``x_w`` under a condition the mean over the K draws of that::

    value = mean_w x_w                               (= the pooled mean: every window has T - 1 predictions)
    se    = sd_w(x_w) / sqrt(N)                      sd with N - 1; N = windows (the rows' ``se`` column)

so the standard error covers both the sample of windows and the junk draws (each window's value
averages its draws; the draws of one window are not independent of each other, so windows, not
window x draw pairs, are the units). When K > 1, rows ``inject_loss_delta_draw`` (condition ``draw``)
keep each draw's loss increase over every window, and ``inject_loss_delta_se_draws`` is their
standard error over the K draws alone (``paired.mean_se``; n = K): the junk's share of the
uncertainty with the windows held fixed. ``inject_loss_clean``, ``inject_loss`` and
``inject_loss_delta`` carry ``se`` in the results table's ``se`` column (SPEC.md "Averages"), NaN
with fewer than two windows; the window count N is the manifest's ``windows.n_seqs``.

Decisions:

- Every layer is corrupted in the same pass, so layer l's reads already carry the effect of the
  junk injected below it. The clean pass (the first pass of every batch, which also gives the
  clean loss and the exposure) keeps, per layer, the clean read norms' median and quiet sets and,
  for structured or same-context junk, the clean reads themselves: one batch's worth of values
  (B x S x Hkv x D per layer, like the V half of a KV cache), released at the end of the batch.
- The random generator of draw d is seeded per (seed, batch, layer, d) (:func:`draw_seed`; batch =
  its first window's index; draw 0's seed is the one of the single draw before ``draws`` existed)
  and draws on the CPU, so the draws do not depend on the device, the dose or the cutoff: every
  dose and cutoff of a junk type sees the same u_j within a draw, and models with the same shapes
  (layers, KV heads, head size, windows per batch, positions) get identical junk.
- A read of norm 0 gives a zero junk vector (structured and same-context).
- Structured junk draws across the batch, so the batch is part of the measurement
  (``fixed_batch``): ``sinkscope inject --eval-batch`` fixes it and the manifest records it; the
  runner never halves it, and with structured junk every batch must hold exactly ``eval_batch >= 2``
  windows (:meth:`Injection.check_batches`): a short last batch (one window: structured junk
  would silently be same-window junk) is refused before the first batch.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from torch import Tensor

from sinkscope.capture import hooks
from sinkscope.capture.record import QUIET_CUTOFFS, read_norm_quantiles
from sinkscope.errors import SinkscopeError
from sinkscope.data.junk import batch_problem
from sinkscope.stats.paired import mean_se
from sinkscope.probes.base import Param, Probe, intervenes, observes, register_probe
from sinkscope.store.results import MetricInfo, Row

#: every junk type, in table order.
JUNK_TYPES = ("structured", "same-context", "gaussian", "random-direction", "own-direction")
#: what ``sinkscope inject`` runs by default: Wang 2026 Table 13's three (the full battery with two cutoffs).
DEFAULT_JUNK = ("structured", "same-context", "gaussian")
CUTOFF_QUANTILES = dict(QUIET_CUTOFFS)
DEFAULT_CUTOFFS = tuple(CUTOFF_QUANTILES)
DEFAULT_DOSES = (0.2, 0.4, 0.8, 1.6)
#: where the quiet set, m_h and transplanted junk come from: the clean pass (SPEC.md) or the corrupted one.
JUNK_SOURCES = ("clean", "corrupted")
#: junk types that transplant other positions' reads (they need the clean reads themselves, not just their norms).
TRANSPLANTED = ("structured", "same-context")
#: variants of the bundled trainer with a projection gate (the only ones with an own direction).
PROJECTION_GATE_VARIANTS = ("projgate", "sink+proj")
OWN_DIRECTION_SENTENCE = ("own-direction junk is the head's projection-gate direction w_h/||w_h||, which only "
                          "projection-gate trainer checkpoints ({}) have")


def _check_doses(doses: tuple) -> str | None:
    try:
        values = [float(d) for d in doses]
    except (TypeError, ValueError):
        return "takes numbers such as 0.2,0.4"
    if not values:
        return "needs at least one dose"
    if any(not np.isfinite(d) or d < 0 for d in values):
        return "takes finite doses >= 0"
    if len(set(values)) != len(values):
        return "lists a dose twice"
    return None


def _distinct(values: tuple) -> str | None:
    if not values:
        return "needs at least one value"
    return "lists a value twice" if len(set(values)) != len(values) else None


def condition_label(junk: str, cutoff: str, dose: float, draw: int = 0) -> str:
    """The runner's pass label of one condition and draw, e.g. ``structured|median|0.4`` (draw 0),
    ``structured|median|0.4|draw1``."""
    return f"{junk}|{cutoff}|{dose:g}" + (f"|draw{draw}" if draw else "")


def draw_seed(seed: int, batch_start: int, layer: int, draw: int = 0) -> int:
    """The generator seed of one (batch, layer, draw): the same for every junk type's doses and cutoffs.

    ``numpy.random.SeedSequence([seed, batch_start, layer, draw])``'s first 64-bit word, shifted
    to 63 bits; draw 0 leaves ``draw`` out (``[seed, batch_start, layer]``), so a single draw is
    the junk of runs made before ``--draws`` existed.
    """
    entropy = [seed, batch_start, layer] + ([draw] if draw else [])
    return int(np.random.SeedSequence(entropy).generate_state(1, dtype=np.uint64)[0] >> 1)


def check_draws(draws: int) -> str | None:
    return None if isinstance(draws, int) and draws >= 1 else "must be at least 1"


def other_positions(n: int, shape: tuple[int, ...], generator: torch.Generator) -> Tensor:
    """For every item of ``shape`` whose own index is along dim 0 of a flat range of ``n``: a uniform other index.

    ``shape`` is (n, ...); entry [p, ...] is drawn uniformly from {0..n-1} without p. int64, CPU.
    """
    r = torch.randint(0, n - 1, shape, generator=generator)  # (n, ...)
    own = torch.arange(n).view(n, *([1] * (len(shape) - 1)))  # (n, 1, ...)
    return r + (r >= own).long()  # skips its own index


@dataclass
class Reads:
    """What the junk of one layer is drawn from: one batch's reads, per window and KV head."""

    median: Tensor  # (B, Hkv) float64: m_h, the median read norm
    quiet: dict[str, Tensor]  # cutoff -> (B, S, Hkv) bool: ||v_j|| strictly below the cutoff
    values: Tensor | None  # (B, S, Hkv, D) the reads (their dtype), kept for transplanted junk only
    norms: Tensor | None  # (B, S, Hkv) float32, with ``values``


def load_gate_directions(checkpoint: str | Path) -> dict[int, Tensor]:
    """The projection gate's w_h per layer, (H, D) float32, from a trainer checkpoint's weights."""
    from safetensors.torch import load_file

    folder = Path(checkpoint)
    weights = load_file(str(folder / "model.safetensors"))
    out = {}
    for key, value in weights.items():
        parts = key.split(".")
        if key.endswith(".attn.gate_w") and "h" in parts:
            out[int(parts[parts.index("h") + 1])] = value.float()
    if not out:
        raise SinkscopeError(OWN_DIRECTION_SENTENCE.format(", ".join(PROJECTION_GATE_VARIANTS))
                             + f"; {checkpoint} has no projection gate.")
    return out


@register_probe(
    "injection",
    params=(
        Param("junk", tuple, DEFAULT_JUNK, "junk types (comma-separated): " + ", ".join(JUNK_TYPES),
              choices=JUNK_TYPES, check=_distinct),
        Param("cutoffs", tuple, DEFAULT_CUTOFFS, "quiet-read cutoffs: median, q25", choices=DEFAULT_CUTOFFS,
              check=_distinct),
        Param("doses", tuple, DEFAULT_DOSES, "doses eps (junk norm = eps x the head's median read norm)",
              check=_check_doses),
        Param("seed", int, 0, "seeds the junk draws (per batch, layer and draw)"),
        Param("draws", int, 1, "seeded draws of the junk per condition (mean and standard error over windows)",
              check=check_draws),
        Param("junk_source", str, "clean", "where the quiet set, m_h and transplanted junk come from: clean (the "
              "clean pass of the batch, SPEC.md) or corrupted (the reads the layer receives under corruption)",
              choices=JUNK_SOURCES),
        Param("eval_batch", int, 8, "windows per evaluation batch (structured junk draws across it)",
              check=lambda b: None if b >= 1 else "must be at least 1"),
        Param("directions", str, None, "own-direction: the trainer checkpoint whose projection gates give w_h",
              optional=True),
    ),
    metrics={
        "inject_loss_clean": MetricInfo(
            "Loss, clean", "nats / token", "mean next-token cross-entropy over every window and position, "
            "uncorrupted (the same batches as every condition)", "SPEC.md 'Value-read injection'", "", per="model"),
        "inject_loss": MetricInfo(
            "Loss under injection", "nats / token",
            "the same loss with every quiet read v_j (||v_j|| < cutoff) replaced by v_j + eps m_h u_j in every "
            "layer, per junk type, cutoff and dose eps", "SPEC.md 'Value-read injection'; Wang 2026 §5.1",
            "", per="model"),
        "inject_loss_delta": MetricInfo(
            "Loss increase under injection", "nats / token", "inject_loss - inject_loss_clean on the same windows "
            "(mean over the draws)", "SPEC.md 'Value-read injection'; Wang 2026 §5.1, Tables 3, 9, 10, 13",
            "higher = the model is hurt more by junk in its quiet reads", per="model"),
        "inject_loss_delta_se_draws": MetricInfo(
            "Loss increase: standard error over draws", "nats / token", "sd over the K draws (K - 1) / sqrt(K) of "
            "each draw's inject_loss_delta_draw (the junk's share of the uncertainty, windows held fixed); n = K; "
            "written when draws > 1", "SPEC.md 'Value-read injection', 'Resolved (2026-12)'", "", per="model"),
        "inject_loss_delta_draw": MetricInfo(
            "Loss increase under one draw", "nats / token", "inject_loss_delta of one seeded draw of the junk "
            "(condition draw), over every window; written when draws > 1; n = the windows, no se (one draw's windows "
            "are not kept apart; inject_loss_delta_se_draws is the draws' spread)",
            "SPEC.md 'Value-read injection', 'Resolved (2026-12)'", "", per="model"),
    },
)
class Injection(Probe):
    """The loss increase when junk of a given type and dose is added to every head's quiet value reads."""

    fixed_batch = True
    #: the gate directions are read from a checkpoint (the same in every share); ``clean`` and
    #: ``batch_losses`` live for one batch (refilled by its clean pass, emptied by ``end_batch``).
    not_state = ("gate_directions", "clean", "batch_losses")

    def setup(self) -> None:
        self.doses = tuple(float(d) for d in self.doses)
        self.conditions = [(j, c, d) for j in self.junk for c in self.cutoffs for d in self.doses]
        K = self.draws
        # pass index: 0 the clean pass, then 1 + condition x K + draw
        self.labels = {condition_label(*cond, draw): 1 + i * K + draw
                       for i, cond in enumerate(self.conditions) for draw in range(K)}
        self.by_label = {condition_label(*cond, draw): (*cond, draw)
                         for cond in self.conditions for draw in range(K)}
        self.gate_directions: dict[int, Tensor] = {}  # layer -> w_h (H, D), own-direction only
        if "own-direction" in self.junk:
            if self.directions is None:
                raise SinkscopeError(OWN_DIRECTION_SENTENCE.format(", ".join(PROJECTION_GATE_VARIANTS))
                                     + "; this model is not one.")
            self.gate_directions = load_gate_directions(self.directions)
        self.keep_values = any(j in TRANSPLANTED for j in self.junk)
        self.clean: dict[int, Reads] = {}  # layer -> this batch's clean reads (junk_source "clean")
        self.batch_losses: dict[int, Tensor] = {}  # pass index -> (B,) each window's mean cross-entropy
        n = 1 + len(self.conditions) * K
        self.loss_sum = torch.zeros(n, dtype=torch.float64)  # clean, then each condition x draw: summed cross-entropy
        self.loss_n = torch.zeros(n, dtype=torch.float64)  # predictions
        # per window x_w: clean, each condition's loss (mean over draws), each condition's increase
        m = 1 + 2 * len(self.conditions)
        self.window_sum = torch.zeros(m, dtype=torch.float64)  # sum_w x_w
        self.window_sq = torch.zeros(m, dtype=torch.float64)  # sum_w x_w^2
        self.window_n = torch.zeros(1, dtype=torch.float64)  # windows

    def options(self) -> dict:
        out = super().options()
        out["doses"] = list(self.doses)
        return out

    def passes(self) -> tuple[str | None, ...]:
        return (None, *self.labels)

    def check_batches(self, n_windows: int, batch_size: int) -> str | None:
        return batch_problem(self.junk, batch_size, n_windows)

    # ---- the junk ------------------------------------------------------------------------------
    def reads(self, v: Tensor, cutoffs: tuple[str, ...], keep_values: bool) -> Reads:
        """The median read norm and quiet sets of ``v`` (B, S, Hkv, D), and ``v`` itself if kept."""
        norms = v.float().norm(dim=-1)  # (B, S, Hkv)
        qs = read_norm_quantiles(norms.transpose(1, 2), (0.5, *(CUTOFF_QUANTILES[c] for c in cutoffs)))  # (1+K, B, Hkv)
        quiet = {c: norms.double() < qs[1 + k].unsqueeze(1) for k, c in enumerate(cutoffs)}  # (B, S, Hkv): strict <
        return Reads(qs[0], quiet, v if keep_values else None, norms if keep_values else None)

    def junk_vectors(self, junk: str, layer: int, v: Tensor, norms: Tensor | None, draw: int = 0) -> Tensor:
        """Unit junk u_j for every read, (B, S, Hkv, D) float32 on v's device.

        ``v`` (B, S, Hkv, D) float32 are the reads junk is transplanted from (structured,
        same-context; ``norms`` (B, S, Hkv) theirs); other junk types use only its shape and device.
        """
        B, S, Hkv, D = v.shape
        generator = torch.Generator().manual_seed(draw_seed(self.seed, self.batch_start, layer, draw))
        if junk in TRANSPLANTED:
            heads = torch.arange(Hkv, device=v.device).view(1, 1, Hkv)  # (1, 1, Hkv)
            if junk == "structured":  # another position anywhere in the batch
                if B * S < 2:
                    raise SinkscopeError("structured junk needs at least two positions in the evaluation batch.")
                flat = other_positions(B * S, (B * S, Hkv), generator).view(B, S, Hkv).to(v.device)  # (B, S, Hkv)
                source, source_norms = v.reshape(B * S, Hkv, D), norms.reshape(B * S, Hkv)
                u, n = source[flat, heads], source_norms[flat, heads]  # (B, S, Hkv, D), (B, S, Hkv)
            else:  # another position of the same window
                if S < 2:
                    raise SinkscopeError("same-context junk needs windows of at least two positions.")
                pos = other_positions(S, (S, B, Hkv), generator).permute(1, 0, 2).to(v.device)  # (B, S, Hkv)
                rows = torch.arange(B, device=v.device).view(B, 1, 1)  # (B, 1, 1)
                u, n = v[rows, pos, heads], norms[rows, pos, heads]  # (B, S, Hkv, D), (B, S, Hkv)
            return torch.where(n.unsqueeze(-1) > 0, u / n.clamp_min(torch.finfo(u.dtype).tiny).unsqueeze(-1), 0.0)
        if junk == "gaussian":
            g = torch.randn(B, S, Hkv, D, generator=generator).to(v.device)  # (B, S, Hkv, D)
        elif junk == "random-direction":
            g = torch.randn(Hkv, D, generator=generator).to(v.device).expand(B, S, Hkv, D)  # one per head
        elif junk == "own-direction":
            if layer not in self.gate_directions:
                raise SinkscopeError(f"layer {layer} has no projection gate to give an own direction.")
            g = self.gate_directions[layer].to(v.device).expand(B, S, Hkv, D)  # (B, S, Hkv, D): w_h per head
        else:  # pragma: no cover - Param choices
            raise ValueError(junk)
        return g / g.norm(dim=-1, keepdim=True)

    @intervenes(hooks.ATTN_V)
    def inject(self, layer: int, v: Tensor) -> Tensor | None:  # v: (B, S, Hkv, D)
        if self.pass_label is None:  # the clean pass: keep what the conditions' passes draw from
            if self.junk_source == "clean":
                self.clean[layer] = self.reads(v, self.cutoffs, self.keep_values)
            return None
        junk, cutoff, dose, draw = self.by_label[self.pass_label]
        if self.junk_source == "clean":
            reads = self.clean[layer]
        else:  # the reads this layer receives under corruption (the protocol before 2026-12)
            reads = self.reads(v, (cutoff,), junk in TRANSPLANTED)
        vf = v.float()  # (B, S, Hkv, D)
        source = reads.values.float() if reads.values is not None else vf  # (B, S, Hkv, D)
        u = self.junk_vectors(junk, layer, source, reads.norms, draw)  # (B, S, Hkv, D)
        step = dose * reads.median.float().unsqueeze(1) * reads.quiet[cutoff].float()  # (B, S, Hkv): eps m_h if quiet
        return (vf + step.unsqueeze(-1) * u).to(v.dtype)  # (B, S, Hkv, D)

    # ---- the loss --------------------------------------------------------------------------------
    @observes(hooks.LOSS)
    def loss(self, layer: None, value: Tensor) -> None:  # value: (B, T-1)
        if self.loss_sum.device != value.device:  # accumulate where the loss lives (no host sync per batch)
            for name in ("loss_sum", "loss_n", "window_sum", "window_sq", "window_n"):
                setattr(self, name, getattr(self, name).to(value.device))
        index = 0 if self.pass_label is None else self.labels[self.pass_label]
        per_window = value.double().sum(dim=1)  # (B,)
        self.loss_sum[index] += per_window.sum()
        self.loss_n[index] += value.numel()
        self.batch_losses[index] = per_window / value.shape[1]  # (B,): each window's mean

    def end_batch(self) -> None:
        self.clean = {}
        losses, self.batch_losses = self.batch_losses, {}
        if 0 not in losses:
            return
        C, K = len(self.conditions), self.draws
        clean = losses[0]  # (B,)
        if C:
            under = torch.stack([losses[i] for i in range(1, 1 + C * K)]).view(C, K, -1).mean(dim=1)  # (C, B)
            x = torch.cat([clean.unsqueeze(0), under, under - clean])  # (1 + 2C, B)
        else:
            x = clean.unsqueeze(0)
        self.window_sum += x.sum(dim=1)
        self.window_sq += (x * x).sum(dim=1)
        self.window_n += clean.numel()

    def standard_errors(self) -> tuple[list[float], int]:
        """sd over windows (N - 1) / sqrt(N) of each x_w (clean, each condition's loss, its increase), and N."""
        n = int(self.window_n.cpu()[0])
        if n < 2:
            return [], n
        s, sq = self.window_sum.cpu(), self.window_sq.cpu()
        var = ((sq - s * s / n) / (n - 1)).clamp_min(0.0)
        return (var / n).sqrt().tolist(), n

    def rows(self) -> list[Row]:
        """The loss rows; ``n`` is the windows (the unit of ``se``, SPEC.md "Tables"), K on the draws' se row."""
        sums, counts = self.loss_sum.cpu(), self.loss_n.cpu()
        clean = float(sums[0] / counts[0]) if counts[0] else float("nan")
        se, windows = self.standard_errors()
        C, K = len(self.conditions), self.draws
        def error(i: int) -> float:
            return se[i] if se else float("nan")

        out = [Row(self.name, "inject_loss_clean", None, None, clean, windows, se=error(0))]
        for i, (junk, cutoff, dose) in enumerate(self.conditions):
            conditions = (("junk", junk), ("cutoff", cutoff), ("dose", dose))
            index = slice(1 + i * K, 1 + (i + 1) * K)  # this condition's draws
            total, count = float(sums[index].sum()), int(counts[index].sum())
            loss = total / count if count else float("nan")
            out.append(Row(self.name, "inject_loss", None, None, loss, windows, conditions, se=error(1 + i)))
            out.append(Row(self.name, "inject_loss_delta", None, None, loss - clean, windows, conditions,
                           se=error(1 + C + i)))
            if K > 1:
                per_draw = [float(sums[j] / counts[j]) - clean if counts[j] else float("nan")
                            for j in range(1 + i * K, 1 + (i + 1) * K)]
                out.append(Row(self.name, "inject_loss_delta_se_draws", None, None, mean_se(per_draw)[1], K,
                               conditions))
                for draw, value in enumerate(per_draw):
                    out.append(Row(self.name, "inject_loss_delta_draw", None, None, value, windows,
                                   (*conditions, ("draw", draw))))
        return out
