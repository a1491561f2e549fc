"""What every probe is: a streaming reduction from named hook points to rows of the results table.

A probe is one class in one module, registered by a decorator that names it, documents its
metrics and declares its parameters; the hook points it reads are the ones its methods are
marked with, so nothing is listed twice::

    @register_probe("p0_mass", metrics={"p0_mass": MetricInfo(...)})
    class P0Mass(Probe):
        def setup(self):
            self.acc = HeadMeans(self.spec.n_layers, self.spec.n_heads)

        @observes(hooks.ATTN)
        def attention(self, layer, record):
            self.acc.add(layer, record.key_mass(0)[:, :, 1:], item_dims=(0, 2))

        def rows(self):
            return self.acc.rows(self.name, "p0_mass")

``@observes(template, ...)`` methods receive ``(layer, value)`` for each hook point
(``capture/hooks.py``; layer is None for ``tokens`` and ``loss``). ``@intervenes(template)``
methods receive ``(layer, value)`` and return a replacement (or None to leave it), applied
inside the same forward pass. A probe that needs forward passes under conditions other than
the clean one (an injection sweep) lists them in ``passes()``; the runner runs each batch once
per pass and tells the probe which pass it is in (``self.pass_label``).

A probe that reads the value gate's row moments from the attention record
(``record.gate_moments()``) says so with ``record_columns = frozenset({"value_gate"})`` (the
quiet-set masses of ``record.quiet_mass()``: ``"quiet"``): a fused
capture then appends the gate's columns to the values of the kernel call that computes the
layer's output (DESIGN.md "Probes: streaming reductions"), and computes nothing extra otherwise.

A probe keeps accumulators of sums and counts shaped by (layer, head), on the device of the
tensors it reduces (float64 where the device has it), and finalises them in ``rows()``. Because
accumulators only add, the numbers do not depend on the batch size, a run can be checkpointed
(``state_dict``, on the CPU) and rolled back (``snapshot``, on the device), and shares of the
windows merge across processes (``merge``). Nothing here moves a tensor to the host while the
forward pass runs.

What is state (what ``state_dict``/``load_state_dict``, ``snapshot``/``restore`` and ``merge``
carry): every attribute holding a Tensor or an :class:`Accumulator`, directly or as the leaves of
dicts (str or int keys), lists and tuples, keyed by its path (``self.quiet = {"median":
HeadMeans(...)}`` is ``quiet.median``). Attributes without tensors (parameters, labels, head
lists) are configuration. State is found the first time it is taken (after ``setup``), so a
container's entries are made in ``setup``; a state that does not hold the same keys is refused.
Tensors held any other way (an object, a set, a container mixing them with other values) are a
TypeError naming the probe and attribute, unless the class lists the attribute in ``not_state``
(configuration) or overrides these five methods (``MassiveActivation``). A Python number a probe
increments is state the base class cannot see: count in a tensor.

Pooling convention (SPEC.md "Averages"): a per-head value is the mean over items (query
positions i >= 1 and sequences, unless the metric says otherwise: the exposure probe's quiet and
phantom mass average over every query i >= 0, as Wang 2026's tables do); a per-layer value is the
mean over that layer's heads; a model value is the mean over layers. ``n`` is the number of
units the value is a mean over, the units its ``se`` is over where it has one (SPEC.md "Tables"):
the windows for every row of a mean over windows (``HeadMeans``: head, layer and model rows alike).
"""

from __future__ import annotations

import copy
import inspect
import types
from dataclasses import dataclass
from typing import Any, Callable, ClassVar

import numpy as np
import torch
from torch import Tensor

from sinkscope.capture import hooks as hp
from sinkscope.capture.families import ModelSpec
from sinkscope.errors import SinkscopeError, suggest
from sinkscope.store.results import MetricInfo, Row

__all__ = ["Accumulator", "HeadMeans", "MetricInfo", "Param", "Probe", "Row", "intervenes", "observes",
           "register_probe"]


# ---- parameters ------------------------------------------------------------------------------------


def non_negative(value: float) -> str | None:
    """A ``Param`` check: the value is 0 or more."""
    return None if value >= 0 else "must be 0 or more"


@dataclass(frozen=True)
class Param:
    """A probe parameter: name, type, default, help, and optional allowed values or check.

    ``check(value)`` returns an error phrase (e.g. "must lie in (0, 1)") or None; ``optional``
    parameters also take None.
    """

    name: str
    type: type
    default: Any
    help: str = ""
    choices: tuple | None = None
    check: Callable[[Any], str | None] | None = None
    optional: bool = False

    def coerce(self, probe: str, value: Any) -> Any:
        """``value`` as this parameter's type, or a one-sentence error."""
        if value is None and self.optional:
            return None
        if self.type is bool:
            if isinstance(value, str) and value.lower() in ("true", "false", "1", "0", "yes", "no"):
                value = value.lower() in ("true", "1", "yes")
            ok = isinstance(value, bool)
        elif self.type in (int, float):
            if isinstance(value, str):
                try:
                    value = self.type(value)
                except ValueError:
                    pass
            ok = isinstance(value, (int, float)) and not isinstance(value, bool) and (
                self.type is float or float(value).is_integer())
            value = self.type(value) if ok else value
        elif self.type is tuple:
            if isinstance(value, str):
                value = tuple(v.strip() for v in value.split(",") if v.strip())
            ok = isinstance(value, (list, tuple))
            value = tuple(value) if ok else value
        else:
            ok = isinstance(value, self.type)
        if not ok:
            raise SinkscopeError(f"the {probe} parameter {self.name} must be {self.type.__name__}, not {value!r}.")
        if self.choices is not None:
            bad = [v for v in (value if isinstance(value, tuple) else (value,)) if v not in self.choices]
            if bad:
                raise SinkscopeError(f"the {probe} parameter {self.name} takes {', '.join(map(str, self.choices))}, "
                                     f"not {bad[0]!r}.")
        problem = self.check(value) if self.check is not None else None
        if problem:
            raise SinkscopeError(f"the {probe} parameter {self.name} {problem} (got {value!r}).")
        return value


# ---- registry ----------------------------------------------------------------------------------------

#: every registered probe class, by name (filled by ``register_probe`` as probe modules are imported).
PROBES: dict[str, type["Probe"]] = {}


def observes(*templates: str):
    """Mark a method ``(self, layer, value)`` as the reader of these hook points."""
    for template in templates:
        hp.parse(template)  # an unknown name fails at import, with a suggestion

    def mark(method):
        method._observes = tuple(templates)
        return method
    return mark


def intervenes(template: str):
    """Mark a method ``(self, layer, value) -> replacement | None`` as an intervention."""
    if template not in hp.INTERVENABLE:
        raise ValueError(f"{template!r} cannot be intervened on; intervenable points: {sorted(hp.INTERVENABLE)}")

    def mark(method):
        method._intervenes = template
        return method
    return mark


def register_probe(name: str, *, metrics: dict[str, MetricInfo], params: tuple[Param, ...] | list[Param] = (),
                   summary: str = ""):
    """Class decorator: name the probe, document its metrics, declare its parameters, register it.

    The hook points it needs are read from its ``@observes``/``@intervenes`` methods.
    """
    def wrap(cls: type[Probe]) -> type[Probe]:
        if not issubclass(cls, Probe):
            raise TypeError(f"{cls.__name__} must subclass Probe")
        observers: dict[str, str] = {}
        interventions: dict[str, str] = {}
        for attr, member in inspect.getmembers(cls, inspect.isfunction):
            for template in getattr(member, "_observes", ()):
                observers[template] = attr
            if getattr(member, "_intervenes", None):
                interventions[member._intervenes] = attr
        if not observers and not interventions and not getattr(cls, "reads_windows", False):
            raise TypeError(f"probe {name!r} reads no hook point; mark a method with @observes(...)")
        cls.name = name
        cls.metrics = dict(metrics)
        cls.params = tuple(params)
        cls.summary = summary or (inspect.getdoc(cls) or "").split("\n")[0]
        cls.observers = observers
        cls.interventions = interventions
        cls.hooks = tuple(sorted(set(observers) | set(interventions)))
        previous = PROBES.get(name)
        if previous is not None and previous.__qualname__ != cls.__qualname__:
            raise ValueError(f"two probes are registered as {name!r}: {previous.__qualname__} and {cls.__qualname__}")
        PROBES[name] = cls
        return cls
    return wrap


# ---- accumulators ------------------------------------------------------------------------------------


def _accumulate_dtype(device: torch.device) -> torch.dtype:
    """float64 where the device has it (MPS does not)."""
    return torch.float32 if device.type == "mps" else torch.float64


def grow(t: Tensor, shape: tuple[int, ...], device) -> Tensor:
    """``t`` where it is needed: zeros of ``shape`` on ``device`` the first time (an empty placeholder).

    For accumulators whose shape is known only from the first hook value (the hidden width, the
    window length): ``setup`` makes an empty tensor, the first observation grows it (see
    :class:`LazyTensors`).
    """
    if t.numel() == 0:
        return torch.zeros(shape, dtype=_accumulate_dtype(torch.device(device)), device=device)
    return t if t.device == device else t.to(device)


class Accumulator:
    """What a probe's accumulator object offers so checkpoints, retries and merging handle it.

    ``state_dict`` (a CPU copy), ``load_state_dict``, ``merge`` (add another share's state, as
    if its windows came after these) and ``snapshot`` (an independent copy where it lives, for
    rolling back a batch; a deep copy unless the accumulator never changes a tensor in place).
    Plain tensor attributes of a probe are accumulators too (added).
    """

    def snapshot(self) -> "Accumulator":
        return copy.deepcopy(self)

    def state_dict(self) -> dict:
        raise NotImplementedError

    def load_state_dict(self, state: dict) -> None:
        raise NotImplementedError

    def merge(self, other: "Accumulator") -> None:
        raise NotImplementedError


#: ``HeadMeans.windows`` of a layer whose window count is unknown (a state from before the window
#: statistics): negative however many windows are added later, so no branch runs per layer.
UNKNOWN_WINDOWS = -(2 ** 62)


class HeadMeans(Accumulator):
    """Sums and counts per (layer, head), finalised into per-head means and aggregates.

    Sums stay on the device of the values added (per layer, so a model sharded over devices
    needs no transfer); counts come from shapes and live on the CPU. A layer is either
    *accumulated* (``add``: a mean over items) or *fixed* (``set``: one value per head, e.g. a
    learned parameter, identical in every share of a data-parallel run, so merging keeps it).

    Standard error over windows (SPEC.md "Averages", resolved 2026-12): when ``add``'s item
    dimensions include the batch axis 0 (the windows), each window's own mean (``per_item``
    averaged over the other item dimensions) is also accumulated as a sum and a sum of squares
    per head, and so is the layer's per-window mean over its heads, with the number of windows
    ``n_w`` per layer: O(L x H) state, on the device, that adds under ``merge`` (a torchrun share,
    a resumed run), so the merged standard error is over every window of every share. The rows
    carry ``se = sd / sqrt(n_w)``, the sd over windows with ``n_w - 1`` in the denominator
    (``paired.mean_se``'s convention), for the head rows and the layer rows; it is NaN for a fixed
    layer, with fewer than 2 windows, and for a layer added without the batch axis among the item
    dimensions. The model row (the mean over layers) has its standard error too: each window's
    mean over the layer's heads is also kept, per layer in window order (O(L x windows) on the
    device, appended per batch, never read back while the forward runs), so each window's model
    value (its mean over the layers) is known and ``se`` is their sd over windows / sqrt(n_w), over
    the layers of the row (``rows(layers=...)``: a subset too). Windows of one run have the same
    number of items each, so the mean of the window means is the pooled mean the rows report and
    ``se`` is its standard error. The variance is ``(sum x^2 - (sum x)^2 / n_w) / (n_w - 1)`` in
    float64, clamped at 0. A state from before these statistics (an older progress file) has
    ``windows`` negative (``UNKNOWN_WINDOWS``, unknown) on its layers, and their ``se`` stays NaN;
    one from before the per-window layer means leaves the model row's ``se`` NaN.

    ``n`` of every row is the number of windows behind it, the windows its ``se`` is over (not the
    items: queries x windows; and not summed over heads or layers, which share the windows); 1 on a
    fixed layer (a parameter, read once). An older progress state whose windows are unknown counts
    the items instead.
    """

    def __init__(self, n_layers: int, n_heads: int):
        self.n_layers, self.n_heads = n_layers, n_heads
        self.sums: dict[int, Tensor] = {}  # layer -> (H,) on its device
        self.counts = torch.zeros(n_layers, n_heads, dtype=torch.int64)
        self.seen = torch.zeros(n_layers, dtype=torch.bool)
        self.fixed = torch.zeros(n_layers, dtype=torch.bool)
        #: layer -> (2, H + 1) on its device: per-window means summed (row 0) and squared and summed
        #: (row 1), per head (columns :H) and for the layer's mean over its heads (column H).
        self.window_sums: dict[int, Tensor] = {}
        self.windows = torch.zeros(n_layers, dtype=torch.int64)  # windows behind window_sums (< 0: unknown)
        #: layer -> [(B,) per batch]: each window's mean over the layer's heads, in window order (the model
        #: row's standard error pairs them across layers); never written in place, so a snapshot shares them.
        self.window_layer_means: dict[int, list[Tensor]] = {}

    def add(self, layer: int, per_item: Tensor, item_dims: tuple[int, ...]) -> None:
        """Add items of ``per_item`` (head axis 1) summed over ``item_dims``.

        A layer may have fewer heads than ``n_heads`` (the widest layer's): its heads are the first
        ones, and its rows and layer mean are over its own heads only. With axis 0 (the windows)
        among ``item_dims``, each window's mean is accumulated too, for the standard error.

        Example: ``per_item`` (B, H, T) with ``item_dims=(0, 2)`` adds B*T items per head.
        """
        x = per_item.detach()
        values = x.to(_accumulate_dtype(x.device))
        summed = values.sum(dim=item_dims)  # (H',)
        heads = summed.shape[0]
        if heads < self.n_heads:  # a layer with fewer heads than the widest (MiMo's full layers: half the KV heads)
            summed = torch.cat([summed, summed.new_zeros(self.n_heads - heads)])  # (H,)
        previous = self.sums.get(layer)
        self.sums[layer] = summed if previous is None else previous.to(summed.device) + summed
        count = 1
        for d in item_dims:
            count *= x.shape[d]
        self.counts[layer, :heads] += count
        self.seen[layer] = True
        rest = tuple(d for d in item_dims if d != 0)
        per_window_items = count // max(x.shape[0], 1)
        if 0 in item_dims and x.shape[0] > 0 and per_window_items > 0:
            per_window = (values.sum(dim=rest) if rest else values) / per_window_items  # (B, H')
            of_layer = per_window.mean(dim=1, keepdim=True)  # (B, 1): the window's mean over the layer's heads
            pad = per_window.new_zeros(x.shape[0], self.n_heads - heads)
            window_means = torch.cat([per_window, pad, of_layer], dim=1)  # (B, H + 1)
            stats = torch.stack([window_means.sum(dim=0), window_means.square().sum(dim=0)])  # (2, H + 1)
            mine = self.window_sums.get(layer)
            self.window_sums[layer] = stats if mine is None else mine.to(stats.device) + stats
            self.windows[layer] += x.shape[0]  # no branch: an unknown count (UNKNOWN_WINDOWS) stays negative
            self.window_layer_means.setdefault(layer, []).append(of_layer[:, 0])  # (B,)

    def set(self, layer: int, values: Tensor) -> None:
        """Record one value per head (e.g. a learned parameter), n = 1 (and no standard error)."""
        self.sums[layer] = values.detach().to(_accumulate_dtype(values.device))
        self.counts[layer] = 1
        self.seen[layer] = True
        self.fixed[layer] = True
        self.window_sums.pop(layer, None)
        self.window_layer_means.pop(layer, None)
        self.windows[layer] = 0

    def snapshot(self) -> "HeadMeans":
        """A deep copy, except the per-window layer means, which are shared (``add`` only appends)."""
        kept, self.window_layer_means = self.window_layer_means, {}
        try:
            copy_ = copy.deepcopy(self)
        finally:
            self.window_layer_means = kept
        copy_.window_layer_means = {layer: list(parts) for layer, parts in kept.items()}
        return copy_

    def n_of(self, layer: int) -> int:
        """``n`` of the layer's rows: the windows behind them (1 on a fixed layer; the items where unknown)."""
        if self.fixed[layer]:
            return 1
        windows = int(self.windows[layer])
        return windows if windows > 0 else int(self.counts[layer].max())

    def _window_layer_means(self, layer: int) -> Tensor | None:
        """(n_w,) float64 on the CPU: each window's mean over the layer's heads; None unless kept for every window."""
        parts = self.window_layer_means.get(layer)
        windows = int(self.windows[layer])
        if not parts or bool(self.fixed[layer]) or sum(p.shape[0] for p in parts) != windows:
            return None
        return torch.cat([p.to("cpu", torch.float64) for p in parts])

    def model_standard_error(self, layers: list[int]) -> float:
        """The model row's se over windows: sd (n_w - 1) of each window's mean over ``layers`` of its
        layer means, / sqrt(n_w); NaN with fewer than 2 windows or where a layer's window means are
        not all kept (fixed, an older state, layers that saw different windows)."""
        columns = [self._window_layer_means(layer) for layer in layers]
        if not columns or any(c is None for c in columns) or len({c.shape[0] for c in columns}) != 1:
            return float("nan")
        per_window = torch.stack(columns).mean(dim=0)  # (n_w,): each window's model value
        n = per_window.shape[0]
        if n < 2:
            return float("nan")
        return float(per_window.std(unbiased=True) / n ** 0.5)

    def means(self) -> Tensor:
        """(L, H) float64 on the CPU: per-head means (0 where nothing was seen)."""
        out = torch.zeros(self.n_layers, self.n_heads, dtype=torch.float64)
        for layer, sums in self.sums.items():
            out[layer] = sums.to("cpu", torch.float64) / self.counts[layer].clamp(min=1)
        return out

    def standard_errors(self) -> Tensor:
        """(L, H + 1) float64 on the CPU: the standard error over windows per head (column H: of the
        layer's mean over heads); NaN where it is undefined (see the class docstring)."""
        out = torch.full((self.n_layers, self.n_heads + 1), float("nan"), dtype=torch.float64)
        for layer, stats in self.window_sums.items():
            n = int(self.windows[layer])
            if n < 2 or bool(self.fixed[layer]):
                continue
            total, squares = stats.to("cpu", torch.float64)
            variance = ((squares - total * total / n) / (n - 1)).clamp(min=0.0)
            out[layer] = (variance / n).sqrt()
        return out

    def window_matrix(self) -> Tensor | None:
        """(L + 1, n_w) float64: each window's mean over a layer's heads (NaN on a layer not seen), then each
        window's model value (the mean over the layers seen, as the model row's se reads it); None when the
        window means are not all kept (a fixed layer, a merged or older state) or fewer than 2 windows."""
        layers = [layer for layer in range(self.n_layers) if self.seen[layer]]
        columns = [self._window_layer_means(layer) for layer in layers]
        if not columns or any(c is None for c in columns) or len({c.shape[0] for c in columns}) != 1 \
                or columns[0].shape[0] < 2:
            return None
        out = torch.full((self.n_layers + 1, columns[0].shape[0]), float("nan"), dtype=torch.float64)
        for layer, column in zip(layers, columns):
            out[layer] = column
        out[-1] = torch.stack(columns).mean(dim=0)
        return out

    def rows(self, probe: str, metric: str, *, layers: list[int] | None = None) -> list[Row]:
        """Per-head rows, per-layer means over heads, one model mean over the layers seen (each with ``se``;
        ``n`` the windows, see the class docstring). Remembers ``metric`` (``rows_metric``), the name its
        per-window values are saved under (``run/write.py``, ``window_values.npy``)."""
        if layers is None:
            self.rows_metric = metric
        out: list[Row] = []
        layer_values: list[float] = []
        included: list[int] = []
        errors = self.standard_errors()
        for layer in range(self.n_layers):
            if not self.seen[layer] or (layers is not None and layer not in layers):
                continue
            means = self.sums[layer].to("cpu", torch.float64) / self.counts[layer].clamp(min=1)  # (H,)
            head_se = errors[layer, :self.n_heads]
            present = self.counts[layer] > 0  # (H,): a layer with fewer heads than the widest has rows for its own
            if not self.fixed[layer] and not bool(present.all()):
                means, head_se = means[present], head_se[present]
            n = self.n_of(layer)
            for head, (value, se) in enumerate(zip(means.tolist(), head_se.tolist())):
                out.append(Row(probe, metric, layer, head, value, n, se=se))
            layer_values.append(float(means.mean()))
            out.append(Row(probe, metric, layer, None, layer_values[-1], n, se=float(errors[layer, -1])))
            included.append(layer)
        if layer_values:
            out.append(Row(probe, metric, None, None, sum(layer_values) / len(layer_values),
                           max(self.n_of(layer) for layer in included), se=self.model_standard_error(included)))
        return out

    def state_dict(self) -> dict[str, Tensor]:
        """Everything, on the CPU (for a checkpoint file or a process gather)."""
        sums = torch.zeros(self.n_layers, self.n_heads, dtype=torch.float64)
        for layer, values in self.sums.items():
            sums[layer] = values.to("cpu", torch.float64)
        window_sums = torch.zeros(self.n_layers, 2, self.n_heads + 1, dtype=torch.float64)
        for layer, values in self.window_sums.items():
            window_sums[layer] = values.to("cpu", torch.float64)
        kept = {layer: torch.cat([p.to("cpu", torch.float64) for p in parts])
                for layer, parts in self.window_layer_means.items() if parts}
        widest = max((v.shape[0] for v in kept.values()), default=0)
        # (L, most windows kept): NaN past a layer's own windows
        window_layer_means = torch.full((self.n_layers, widest), float("nan"), dtype=torch.float64)
        window_layer_kept = torch.zeros(self.n_layers, dtype=torch.int64)
        for layer, values in kept.items():
            window_layer_means[layer, :values.shape[0]] = values
            window_layer_kept[layer] = values.shape[0]
        return {"sums": sums, "counts": self.counts.clone(), "seen": self.seen.clone(), "fixed": self.fixed.clone(),
                "window_sums": window_sums, "windows": self.windows.clone(),
                "window_layer_means": window_layer_means, "window_layer_kept": window_layer_kept}

    def load_state_dict(self, state: dict[str, Tensor]) -> None:
        self.counts, self.seen = state["counts"].clone(), state["seen"].clone()
        self.fixed = state.get("fixed", torch.zeros_like(self.seen)).clone()
        self.sums = {layer: state["sums"][layer].clone() for layer in range(self.n_layers) if self.seen[layer]}
        if "windows" in state:
            self.windows = state["windows"].clone()
            self.window_sums = {layer: state["window_sums"][layer].clone() for layer in range(self.n_layers)
                                if self.windows[layer] != 0}
        else:  # a state written before the window statistics: their standard errors are unknown
            self.windows = torch.where(self.seen & ~self.fixed, UNKNOWN_WINDOWS, 0).to(torch.int64)
            self.window_sums = {}
        self.window_layer_means = {}  # absent from a state written before them: the model row's se stays NaN
        if "window_layer_kept" in state:
            for layer, kept in enumerate(state["window_layer_kept"].tolist()):
                if kept > 0:
                    self.window_layer_means[layer] = [state["window_layer_means"][layer, :kept].clone()]

    def merge(self, other: "HeadMeans") -> None:
        """Add another share's accumulator (another process's windows, seen after these).

        Fixed layers (``set``) are taken from whichever share has them, not added. The window
        statistics add too, so the standard error is over the windows of both shares.
        """
        for layer in range(self.n_layers):
            if not other.seen[layer]:
                continue
            theirs = other.sums[layer]
            if other.fixed[layer]:
                if not self.seen[layer]:
                    self.sums[layer], self.counts[layer] = theirs.clone(), other.counts[layer]
                    self.seen[layer] = self.fixed[layer] = True
                continue
            mine = self.sums.get(layer)
            self.sums[layer] = theirs.clone() if mine is None else mine + theirs.to(mine.device)
            self.counts[layer] += other.counts[layer]
            self.seen[layer] = True
            their_stats, my_stats = other.window_sums.get(layer), self.window_sums.get(layer)
            if their_stats is not None:
                self.window_sums[layer] = (their_stats.clone() if my_stats is None
                                           else my_stats + their_stats.to(my_stats.device))
            if self.windows[layer] < 0 or other.windows[layer] < 0:
                self.windows[layer] = UNKNOWN_WINDOWS
            else:
                self.windows[layer] += other.windows[layer]
            # their windows after mine (a count that differs from the windows' leaves the model se NaN)
            self.window_layer_means[layer] = (self.window_layer_means.get(layer, [])
                                              + [p.clone() for p in other.window_layer_means.get(layer, [])])


# ---- the probe ------------------------------------------------------------------------------------


class Probe:
    """Base class of every probe (see the module docstring); subclasses are registered by decorator."""

    name: ClassVar[str]
    #: the metrics this probe writes, documented (shown by ``sinkscope ls``, kept in the manifest).
    metrics: ClassVar[dict[str, MetricInfo]]
    #: declared parameters (types, defaults), set as attributes of the instance.
    params: ClassVar[tuple[Param, ...]] = ()
    summary: ClassVar[str] = ""
    #: hook template -> method name, filled by ``register_probe``.
    observers: ClassVar[dict[str, str]] = {}
    interventions: ClassVar[dict[str, str]] = {}
    hooks: ClassVar[tuple[str, ...]] = ()
    #: crafted value columns this probe reads from fused attention records ("value_gate":
    #: ``AttentionRecord.gate_moments``); the capture computes them only when some probe asks.
    record_columns: ClassVar[frozenset[str]] = frozenset()
    #: the probe's numbers depend on which windows share a batch (value-read injection draws junk
    #: across the batch): the runner never halves its batch on out-of-memory, it says so instead.
    fixed_batch: ClassVar[bool] = False
    #: the probe's attention reductions need only the weights (``key_mass``, ``real_mass``, ``phantom_mass``),
    #: so it runs on the records of the eager fallback too (``AttentionRecord.weights_only``: no q, k, v).
    reads_weights_only: ClassVar[bool] = False
    #: attributes that hold tensors but are configuration, not accumulated (never checkpointed,
    #: merged or rolled back), e.g. injection's gate directions.
    not_state: ClassVar[tuple[str, ...]] = ()
    #: the probe reads no hook point: a command's own window reader (``Command.read_windows``) hands it
    #: what it measures (``stream``: each window read through a bounded cache); ``run_probes`` refuses it.
    reads_windows: ClassVar[bool] = False
    #: the probe's passes run sinkscope's attention function (``capture``: the kernel that builds attention
    #: records) even where no probe reads a record, so that a loss it compares across a command's two stages
    #: comes from one kernel (``probes/loss_change.py``); otherwise the model's own implementation runs.
    attention_function: ClassVar[bool] = False

    def __init__(self, spec: ModelSpec, **params):
        self.spec = spec
        for key, value in self.resolve_params(params).items():
            setattr(self, key, value)
        self.pass_label: str | None = None
        #: index of the first window of the current batch (set by the runner before each pass).
        self.batch_start: int = 0
        self.setup()

    @classmethod
    def resolve_params(cls, params: dict) -> dict:
        """Every declared parameter's value: given ones typed and checked, the rest defaults.

        Unknown names and bad values are one-sentence errors (checked before any model loads).
        """
        known = {p.name: p for p in cls.params}
        for key in params:
            if key not in known:
                raise SinkscopeError(f"the probe {cls.name} has no parameter {key!r}"
                                     f"{suggest(key, known)}; its parameters: {', '.join(known) or 'none'}.")
        return {p.name: p.coerce(cls.name, params[p.name]) if p.name in params else p.default for p in cls.params}

    def setup(self) -> None:
        """Create the accumulators (the parameters and ``self.spec`` are set)."""

    @classmethod
    def unmeasurable(cls, spec: ModelSpec, windows: list[int | None], seq_len: int | None) -> str | None:
        """Why this probe can give no number on a model, as a phrase, or None (checked before the run).

        ``windows`` is each layer's sliding window (None: full attention), ``seq_len`` the
        windows' length. A probe that could only write an empty table says so here, so that the
        run stops with one sentence instead of writing nothing.
        """
        return None

    def prepare(self, device: torch.device, log: Callable[[str], None]) -> None:
        """Called by the runner before the first batch, with the device the windows go to and its line printer:
        a probe that allocates by the model's size decides here, and says what it will hold (``mlp_pca``)."""

    def passes(self) -> tuple[str | None, ...]:
        """The forward passes this probe takes part in per batch: None is the clean pass."""
        return (None,)

    def pass_observers(self, label: str | None) -> dict[str, str]:
        """The observers (template -> method) this probe runs on the pass ``label``: all of them by default.

        A probe whose passes read different points narrows them here (``circuit``'s BOS experiment
        reads attention records only on its r = 1 passes), so that a pass computes no point, and
        builds no attention record, that none of its probes reads (forward/runner.py).
        """
        return self.observers

    def pass_inputs(self, ids: Tensor) -> Tensor | None:
        """The token ids (B, T') for the current pass (``self.pass_label``), or None for the windows'.

        Only passes other than the clean one (None) may rewrite their inputs (forward/runner.py).
        """
        return None

    def check_batches(self, n_windows: int, batch_size: int) -> str | None:
        """Why this probe cannot measure ``n_windows`` windows in batches of ``batch_size`` (the last
        one holding the rest), as a sentence, or None. The runner asks before the first batch; a
        ``fixed_batch`` probe refuses a short last batch here (injection's structured junk)."""
        return None

    def end_batch(self) -> None:
        """Called after every pass of a batch has run (for probes that combine passes)."""

    def rows(self) -> list[Row]:
        """Finalise the accumulators into rows."""
        raise NotImplementedError

    def arrays(self) -> dict[str, np.ndarray]:
        """Arrays beside the table, written into the run folder as ``NAME.npy`` (none by default)."""
        return {}

    def options(self) -> dict:
        """The probe's parameters, recorded in the manifest."""
        return {p.name: getattr(self, p.name) for p in self.params}

    # ---- accumulator state: checkpoints (resume), retries (OOM), merging (data parallel) ----
    def _state_names(self) -> tuple[str, ...]:
        """The attributes that are state, found (and checked) the first time state is taken."""
        names = self.__dict__.get("_state_attributes")
        if names is None:
            names = self._state_attributes = tuple(
                name for name, value in vars(self).items()
                if name not in _BASE_ATTRIBUTES and name not in self.not_state and _is_state(self, name, value))
        return names

    def _state_paths(self) -> dict[str, tuple]:
        """Every accumulator's key (``quiet.median``) and path (the attribute, then keys or indices)."""
        paths: dict[str, tuple] = {}
        for name in self._state_names():
            for path in _leaf_paths(self, getattr(self, name), (name,)):
                key = ".".join(map(str, path))
                if key in paths:
                    raise TypeError(f"{_owner(self, name)} has two accumulators keyed {key!r}")
                paths[key] = path
        return paths

    def _accumulators(self) -> dict[str, "Accumulator | Tensor"]:
        """Every accumulator by its key (see the module docstring for what is state)."""
        return {key: _get(self, path) for key, path in self._state_paths().items()}

    def _replace(self, key: str, value: "Accumulator | Tensor") -> None:
        """Put ``value`` where the accumulator ``key`` is (dicts and lists in place, tuples rebuilt)."""
        path = self._state_paths().get(key, (key,))
        setattr(self, path[0], _put(getattr(self, path[0], None), path[1:], value))

    def state_dict(self) -> dict:
        """A CPU copy of every accumulator (small: per layer and head)."""
        return {k: v.state_dict() if isinstance(v, Accumulator) else v.detach().cpu().clone()
                for k, v in self._accumulators().items()}

    def load_state_dict(self, state: dict) -> None:
        mine = self._accumulators()
        _check_keys(self, mine, state, "the state to load")
        for key, value in mine.items():
            if isinstance(value, Accumulator):
                value.load_state_dict(state[key])
            else:
                self._replace(key, state[key].clone().to(value.device))

    def snapshot(self) -> dict:
        """A copy of every accumulator where it lives (no host transfer): for rolling back a batch."""
        return {k: v.snapshot() if isinstance(v, Accumulator) else v.clone() for k, v in self._accumulators().items()}

    def restore(self, snapshot: dict) -> None:
        _check_keys(self, self._accumulators(), snapshot, "the snapshot")
        for key, value in snapshot.items():
            self._replace(key, value)

    def merge(self, other: "Probe") -> None:
        """Fold in another probe's accumulators (same class, same spec), as if it had seen its
        windows after this one's. Probes with non-additive state override this."""
        theirs = other._accumulators()
        mine = self._accumulators()
        _check_keys(self, mine, theirs, "the probe to merge")
        for key, value in mine.items():
            if isinstance(value, Accumulator):
                value.merge(theirs[key])
            else:
                self._replace(key, self._added(value, theirs[key]))

    def _added(self, mine: Tensor, theirs: Tensor) -> Tensor:
        """A tensor accumulator merged with another share's."""
        return mine + theirs.to(mine.device)


class LazyTensors(Probe):
    """A probe whose tensor accumulators are created on first use (empty placeholders before, :func:`grow`)."""

    def _added(self, mine: Tensor, theirs: Tensor) -> Tensor:
        """An empty placeholder takes the other share's tensor; an empty other adds nothing."""
        if theirs.numel() == 0:
            return mine
        if mine.numel() == 0:
            return theirs.clone()
        return mine + theirs.to(mine.device)


# ---- what is state -------------------------------------------------------------------------------

#: attributes every probe has that are not accumulated (``_state_attributes``: the state found).
_BASE_ATTRIBUTES = frozenset({"spec", "pass_label", "batch_start", "_state_attributes"})
#: values that hold no accumulated numbers: scalars, classes, functions, modules, devices, dtypes.
_OPAQUE = (str, bytes, int, float, complex, bool, type(None), type, types.FunctionType, types.MethodType,
           types.BuiltinFunctionType, types.ModuleType, torch.device, torch.dtype)
_CONTAINERS = (dict, list, tuple)
_HOW = ("keep tensors and Accumulators as attributes or as the leaves of dicts (str or int keys), lists and "
        "tuples, list the attribute in the class's not_state if it is configuration, or override state_dict, "
        "load_state_dict, snapshot, restore and merge")


def _probe_name(probe: Probe) -> str:
    cls = type(probe).__name__
    return f"{probe.name!r} ({cls})" if hasattr(probe, "name") else cls


def _owner(probe: Probe, name: str) -> str:
    return f"the attribute {name!r} of the probe {_probe_name(probe)}"


def _holds_state(value: Any, seen: set[int], depth: int = 0) -> bool:
    """Whether ``value`` holds a Tensor, an Accumulator or an array anywhere (containers, sets, objects)."""
    if isinstance(value, (Tensor, Accumulator, np.ndarray)):
        return True
    if isinstance(value, _OPAQUE) or depth > 8 or id(value) in seen:
        return False
    seen.add(id(value))
    if isinstance(value, dict):
        items = [*value.keys(), *value.values()]
    elif isinstance(value, (list, tuple, set, frozenset)):
        items = list(value)
    else:
        items = list(getattr(value, "__dict__", {}).values())
        items += [getattr(value, slot) for slot in getattr(type(value), "__slots__", ()) if hasattr(value, slot)]
    return any(_holds_state(item, seen, depth + 1) for item in items)


def _is_state(probe: Probe, name: str, value: Any) -> bool:
    """True for an accumulator or a container of them; False for configuration; else a TypeError."""
    if not _holds_state(value, set()):
        return False
    if isinstance(value, (Tensor, Accumulator, *_CONTAINERS)):
        for _ in _leaf_paths(probe, value, (name,)):  # checks the whole container
            pass
        return True
    raise TypeError(f"{_owner(probe, name)} holds tensors in a {type(value).__name__}, which the base class "
                    f"cannot checkpoint, merge or roll back; {_HOW}.")


def _leaf_paths(probe: Probe, value: Any, path: tuple):
    """The paths of the accumulators in ``value`` (an accumulator, or a dict, list or tuple of them)."""
    if isinstance(value, (Tensor, Accumulator)):
        yield path
        return
    if isinstance(value, dict):
        items = list(value.items())
        bad = [k for k in value if not isinstance(k, (str, int)) or isinstance(k, bool)]
        if bad:
            raise TypeError(f"{_owner(probe, path[0])} keys accumulators by a {type(bad[0]).__name__} "
                            f"({bad[0]!r}); {_HOW}.")
    elif isinstance(value, (list, tuple)):
        items = list(enumerate(value))
    else:
        where = ".".join(map(str, path))
        raise TypeError(f"{_owner(probe, path[0])} mixes accumulators with {type(value).__name__} values "
                        f"(at {where!r}), which the base class cannot checkpoint, merge or roll back; {_HOW}.")
    for key, item in items:
        yield from _leaf_paths(probe, item, (*path, key))


def _get(probe: Probe, path: tuple) -> Any:
    value = getattr(probe, path[0])
    for key in path[1:]:
        value = value[key]
    return value


def _put(node: Any, path: tuple, value: Any) -> Any:
    """``node`` with the leaf at ``path`` replaced by ``value`` (dicts and lists in place, tuples rebuilt)."""
    if not path:
        return value
    key, rest = path[0], path[1:]
    leaf = _put(node[key], rest, value)
    if isinstance(node, tuple):
        return (*node[:key], leaf, *node[key + 1:])
    node[key] = leaf
    return node


def _check_keys(probe: Probe, mine: dict, theirs: dict, what: str) -> None:
    """One sentence when ``theirs`` does not hold exactly this probe's accumulators."""
    missing, unexpected = [k for k in mine if k not in theirs], [k for k in theirs if k not in mine]
    if missing or unexpected:
        raise ValueError(f"{what} does not match the accumulators of the probe {_probe_name(probe)}: "
                         f"missing {missing or 'none'}, unexpected {unexpected or 'none'} "
                         "(a container's entries must be created in setup()).")


def window_values(probes: list["Probe"]) -> tuple[list[str], np.ndarray | None]:
    """Each window's layer means and model value of every metric a probe accumulates per window (``HeadMeans``
    with every window kept): (metric names, (M, L + 1, n_w) float32), the first accumulator of a name kept."""
    found: dict[str, np.ndarray] = {}
    for probe in probes:
        for accumulator in vars(probe).values():
            metric = getattr(accumulator, "rows_metric", None)
            if not isinstance(accumulator, HeadMeans) or metric is None or metric in found:
                continue
            matrix = accumulator.window_matrix()
            if matrix is not None:
                found[metric] = matrix.numpy().astype(np.float32)
    if not found:
        return [], None
    shapes = [m.shape for m in found.values()]
    common = max(set(shapes), key=shapes.count)  # a probe that saw other windows (a second stage's) is left out
    names = sorted(name for name, m in found.items() if m.shape == common)
    return names, np.stack([found[name] for name in names])
