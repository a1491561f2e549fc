"""Massive activations in the residual stream (Sun et al. 2024; SPEC.md "Massive activations").

Per layer l (the output hidden state of decoder layer l), over every evaluated token:

    massive_activation          = max |h|                       (the top entry)
    massive_activation_channel  = its channel
    massive_activation_position = its position in the window
    massive_activation_ratio    = max |h| / median |h|

The median is not a streaming statistic, so we take it per sequence (exact median of |h| over
that sequence's positions and channels) and average those over sequences; the ratio divides
the overall top by that mean median. Both are independent of the batch size. Ties for the top
keep the first sequence in evaluation order (and within it the first position, then channel).
Model rows: the largest ``massive_activation`` and ``massive_activation_ratio`` over layers (a
mean of maxima would describe no activation). ``n`` is the windows on every row (SPEC.md
"Tables"); no row has an ``se``: a maximum over windows (and layers) is not a mean over them.

Nothing here waits for the device while the model runs: ``observe_residual`` keeps its
accumulators on the hidden state's device (float64 sums where the device has float64; MPS has
not, float32 there) and updates them with tensor operations only. They come to the CPU in
``state_dict``, ``rows`` and ``merge``, once per batch or run rather than once per layer.
"""

from __future__ import annotations

import copy

import torch
from torch import Tensor

from sinkscope.capture import hooks
from sinkscope.probes.base import Probe, observes, register_probe
from sinkscope.store.results import MetricInfo, Row
from sinkscope.probes.stats import median

#: the accumulator names and dtypes on the CPU (the ``state_dict`` format, also of older runs).
_FLOAT_KEYS = ("top", "median_sum")
_INT_KEYS = ("channel", "position", "n_seqs")


def _float_dtype(device: torch.device) -> torch.dtype:
    """float64 where the device has it (every device but Apple's MPS)."""
    return torch.float32 if device.type == "mps" else torch.float64


def _fresh(n_layers: int) -> dict[str, Tensor]:
    """Empty CPU accumulators: top -1 (below any |h|), zero sums and counts, each (L,)."""
    return {"top": torch.full((n_layers,), -1.0, dtype=torch.float64),
            "channel": torch.zeros(n_layers, dtype=torch.int64),
            "position": torch.zeros(n_layers, dtype=torch.int64),
            "median_sum": torch.zeros(n_layers, dtype=torch.float64),
            "n_seqs": torch.zeros(n_layers, dtype=torch.int64)}


def _combine(first: dict[str, Tensor], later: dict[str, Tensor]) -> dict[str, Tensor]:
    """Accumulators of ``first``'s windows followed by ``later``'s (CPU tensors, (L,) each).

    Sums add; the top is the larger one, a tie keeping ``first`` (the earlier windows).
    """
    better = later["top"] > first["top"]  # (L,)
    out = {key: torch.where(better, later[key], first[key]) for key in ("top", "channel", "position")}
    out["median_sum"] = first["median_sum"] + later["median_sum"]
    out["n_seqs"] = first["n_seqs"] + later["n_seqs"]
    return out


class _Live:
    """Accumulators of the windows observed on one device since the last load/merge.

    On the device: ``top`` and ``median_sum`` (L,) float64 (float32 on MPS) and ``within`` (L,)
    int64, the top entry's index t*C + c in its window. On the host (known without asking the
    device): windows per layer and each layer's width C, to split ``within`` at the end.
    """

    def __init__(self, n_layers: int, device: torch.device):
        f = _float_dtype(device)
        self.top = torch.full((n_layers,), -1.0, dtype=f, device=device)
        self.median_sum = torch.zeros(n_layers, dtype=f, device=device)
        self.within = torch.zeros(n_layers, dtype=torch.int64, device=device)
        self.n_seqs = [0] * n_layers
        self.width = [1] * n_layers

    def to_cpu(self) -> dict[str, Tensor]:
        """The CPU state: two device-to-host copies (floats stacked, the indices)."""
        floats = torch.stack([self.top, self.median_sum]).to("cpu").double()  # (2, L)
        within = self.within.to("cpu")  # (L,)
        width = torch.tensor(self.width, dtype=torch.int64)  # (L,) host data, stays on the host
        return {"top": floats[0], "median_sum": floats[1], "channel": within % width, "position": within // width,
                "n_seqs": torch.tensor(self.n_seqs, dtype=torch.int64)}


@register_probe(
    "massive_activation",
    metrics={
        "massive_activation": MetricInfo(
            "Largest residual activation", "max |h|",
            "max |h| over every position and channel of the layer's output residual stream; model row = "
            "largest over layers; n = the windows, no se on any row (a maximum is not a mean over windows)",
            "SPEC.md 'Massive activations'; Sun et al. 2024", "higher = a more massive activation", per="layer"),
        "massive_activation_ratio": MetricInfo(
            "Largest activation / median", "ratio",
            "max |h| divided by the median |h| (exact median per window, averaged over windows); model row = "
            "largest over layers; no se (a maximum over a mean)",
            "SPEC.md 'Massive activations'; Sun et al. 2024", "higher = a more massive activation", per="layer"),
        "massive_activation_channel": MetricInfo(
            "Channel of the largest activation", "channel index",
            "the residual channel holding max |h|; model row = the channel of the largest over layers",
            "SPEC.md 'Massive activations'", per="layer"),
        "massive_activation_position": MetricInfo(
            "Position of the largest activation", "token position",
            "the position in the window holding max |h|; model row = the position of the largest over layers",
            "SPEC.md 'Massive activations'", per="layer"),
        "massive_activation_layer": MetricInfo(
            "Layer of the largest activation", "layer index",
            "the first layer whose max |h| is the model's (the model row's channel and position are that layer's); "
            "no se (a layer index)",
            "SPEC.md 'Massive activations'", per="model"),
    },
)
class MassiveActivation(Probe):
    """The largest residual-stream activation of each layer and its ratio to the median."""

    def setup(self) -> None:
        #: windows already folded on the CPU (loaded, merged): the earliest windows.
        self._base: dict[str, Tensor] = _fresh(self.spec.n_layers)
        #: windows observed since, one set per device (a sharded model spans several), in the
        #: order the devices were first seen.
        self._live: dict[torch.device, _Live] = {}

    @observes(hooks.RESID_POST)
    def residual(self, layer: int, hidden: Tensor) -> None:
        """Fold one layer's output hidden state (B, T, C) in, on its device, without a host sync."""
        magnitude = hidden.detach().abs()  # (B, T, C) in the model's dtype: |h| is exact
        B, T, C = magnitude.shape
        flat = magnitude.reshape(B, T * C)  # (B, T*C)
        live = self._live.get(hidden.device)
        if live is None:
            live = self._live[hidden.device] = _Live(self.spec.n_layers, hidden.device)
        f = live.top.dtype
        # the exact per-window median (the middle pair averaged in float32, as ever), summed
        live.median_sum[layer] += median(flat, dim=-1, dtype=torch.float32, host_select=True).sum(dtype=f)
        live.n_seqs[layer] += B
        live.width[layer] = C
        # first maximal entry in (window, position, channel) order: the earliest window wins ties
        top, index = flat.reshape(-1).max(dim=0)  # (), () flat index b*T*C + t*C + c
        top = top.to(f)
        better = top > live.top[layer]  # () strictly larger: earlier windows keep ties
        live.top[layer] = torch.where(better, top, live.top[layer])
        live.within[layer] = torch.where(better, index % (T * C), live.within[layer])

    # ---- accumulator state: CPU tensors, the format earlier versions wrote ----------------------
    def state_dict(self) -> dict[str, Tensor]:
        """Every accumulator on the CPU: top/median_sum float64, channel/position/n_seqs int64, (L,)."""
        state = self._base
        for live in self._live.values():
            state = _combine(state, live.to_cpu())
        return {key: value.clone() for key, value in state.items()}

    def load_state_dict(self, state: dict[str, Tensor]) -> None:
        self._base = {key: state[key].detach().to("cpu", torch.float64 if key in _FLOAT_KEYS else torch.int64).clone()
                      for key in (*_FLOAT_KEYS, *_INT_KEYS)}
        self._live = {}

    def snapshot(self) -> dict:
        """Copies of every accumulator where it lives (no host transfer), for rolling back a batch."""
        return {"base": {key: value.clone() for key, value in self._base.items()},
                "live": {device: copy.deepcopy(live) for device, live in self._live.items()}}

    def restore(self, snapshot: dict) -> None:
        self._base, self._live = snapshot["base"], snapshot["live"]

    def merge(self, other: "MassiveActivation") -> None:
        """Sum the medians and counts; keep the larger top (ties: this share, the earlier windows)."""
        self.load_state_dict(_combine(self.state_dict(), other.state_dict()))

    def rows(self) -> list[Row]:
        state = self.state_dict()
        top, median_sum, n_seqs = state["top"], state["median_sum"], state["n_seqs"]
        channel, position = state["channel"], state["position"]
        rows: list[Row] = []
        seen = [l for l in range(self.spec.n_layers) if n_seqs[l] > 0]
        ratios = {}
        for l in seen:
            n = int(n_seqs[l])
            ratios[l] = float(top[l] / (median_sum[l] / n))
            rows += [
                Row(self.name, "massive_activation", l, None, float(top[l]), n),
                Row(self.name, "massive_activation_ratio", l, None, ratios[l], n),
                Row(self.name, "massive_activation_channel", l, None, float(channel[l]), n),
                Row(self.name, "massive_activation_position", l, None, float(position[l]), n),
            ]
        if seen:
            n_total = int(max(n_seqs[l] for l in seen))  # the windows (SPEC.md "Tables"); no se: maxima
            largest = max(seen, key=lambda l: (float(top[l]), -l))  # the first layer holding the model's max |h|
            rows += [
                Row(self.name, "massive_activation", None, None, float(top[largest]), n_total),
                Row(self.name, "massive_activation_ratio", None, None, max(ratios.values()), n_total),
                Row(self.name, "massive_activation_channel", None, None, float(channel[largest]), n_total),
                Row(self.name, "massive_activation_position", None, None, float(position[largest]), n_total),
                Row(self.name, "massive_activation_layer", None, None, float(largest), n_total),
            ]
        return rows
