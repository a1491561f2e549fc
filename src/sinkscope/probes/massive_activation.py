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
mean of maxima would describe no activation).

Nothing here waits for the device while the model runs: ``observe_residual`` keeps its
accumulators on the hidden state's device (float64 sums where the device has float64; MPS has
not, float32 there) and updates them with tensor operations only. They come to the CPU in
``state_dict``, ``rows`` and ``merge``, once per batch or run rather than once per layer.
"""

from __future__ import annotations

import torch
from torch import Tensor

from sinkscope.probes.base import MetricInfo, Probe, Row
from sinkscope.probes.stats import median

#: the accumulator names and dtypes on the CPU (the ``state_dict`` format, also of older runs).
_FLOAT_KEYS = ("top", "median_sum")
_INT_KEYS = ("channel", "position", "n_seqs")


def _float_dtype(device: torch.device) -> torch.dtype:
    """float64 where the device has it (every device but Apple's MPS)."""
    return torch.float32 if device.type == "mps" else torch.float64


def _fresh(n_layers: int, device: torch.device) -> dict[str, Tensor]:
    """Empty accumulators: top -1 (below any |h|), zero sums and counts, each (L,)."""
    f, i = _float_dtype(device), torch.int64
    return {"top": torch.full((n_layers,), -1.0, dtype=f, device=device),
            "channel": torch.zeros(n_layers, dtype=i, device=device),
            "position": torch.zeros(n_layers, dtype=i, device=device),
            "median_sum": torch.zeros(n_layers, dtype=f, device=device),
            "n_seqs": torch.zeros(n_layers, dtype=i, device=device)}


def _combine(first: dict[str, Tensor], later: dict[str, Tensor]) -> dict[str, Tensor]:
    """Accumulators of ``first``'s windows followed by ``later``'s (CPU tensors, (L,) each).

    Sums add; the top is the larger one, a tie keeping ``first`` (the earlier windows).
    """
    better = later["top"] > first["top"]  # (L,)
    out = {key: torch.where(better, later[key], first[key]) for key in ("top", "channel", "position")}
    out["median_sum"] = first["median_sum"] + later["median_sum"]
    out["n_seqs"] = first["n_seqs"] + later["n_seqs"]
    return out


def _to_cpu(acc: dict[str, Tensor]) -> dict[str, Tensor]:
    """Device accumulators to CPU float64/int64: two copies (floats stacked, integers stacked)."""
    floats = torch.stack([acc[k] for k in _FLOAT_KEYS]).to("cpu").double()  # (2, L) (MPS: float32 there)
    ints = torch.stack([acc[k] for k in _INT_KEYS]).to("cpu")  # (3, L)
    return {**dict(zip(_FLOAT_KEYS, floats.unbind(0))), **dict(zip(_INT_KEYS, ints.unbind(0)))}


class MassiveActivation(Probe):
    name = "massive_activation"
    needs_residual = True
    metrics = {
        "massive_activation": MetricInfo(
            "Largest residual activation", "max |h|",
            "max |h| over every position and channel of the layer's output residual stream; model row = "
            "largest over layers",
            "SPEC.md 'Massive activations'; Sun et al. 2024", "higher = a more massive activation", per="layer"),
        "massive_activation_ratio": MetricInfo(
            "Largest activation / median", "ratio",
            "max |h| divided by the median |h| (exact median per window, averaged over windows); model row = "
            "largest over layers",
            "SPEC.md 'Massive activations'; Sun et al. 2024", "higher = a more massive activation", per="layer"),
        "massive_activation_channel": MetricInfo(
            "Channel of the largest activation", "channel index",
            "the residual channel holding max |h|", "SPEC.md 'Massive activations'", per="layer"),
        "massive_activation_position": MetricInfo(
            "Position of the largest activation", "token position",
            "the position in the window holding max |h|", "SPEC.md 'Massive activations'", per="layer"),
    }

    def __init__(self, spec):
        super().__init__(spec)
        #: windows already folded on the CPU (loaded, merged): the earliest windows.
        self._base: dict[str, Tensor] = _fresh(spec.n_layers, torch.device("cpu"))
        #: windows observed since, one accumulator set per device (sharded models span several),
        #: in the order the devices were first seen.
        self._live: dict[torch.device, dict[str, Tensor]] = {}

    def observe_residual(self, layer: int, hidden: Tensor) -> None:
        """Fold one layer's output hidden state (B, T, C) in, on its device, without a host sync."""
        magnitude = hidden.detach().abs()  # (B, T, C) in the model's dtype: |h| is exact
        B, T, C = magnitude.shape
        flat = magnitude.reshape(B, T * C)  # (B, T*C)
        acc = self._live.get(hidden.device)
        if acc is None:
            acc = self._live[hidden.device] = _fresh(self.spec.n_layers, hidden.device)
        f = acc["top"].dtype
        # the exact per-window median, mean of the middle pair in float32 (as ever)
        acc["median_sum"][layer] += median(flat, dim=-1, dtype=torch.float32).to(f).sum()
        acc["n_seqs"][layer] += B
        # first maximal entry in (window, position, channel) order: the earliest window wins ties
        top, index = flat.reshape(-1).max(dim=0)  # (), () flat index b*T*C + t*C + c
        top = top.to(f)
        better = top > acc["top"][layer]  # () strictly larger: earlier windows keep ties
        within = index % (T * C)  # () t*C + c
        acc["top"][layer] = torch.where(better, top, acc["top"][layer])
        acc["position"][layer] = torch.where(better, within // C, acc["position"][layer])
        acc["channel"][layer] = torch.where(better, within % C, acc["channel"][layer])

    # ---- accumulator state: CPU tensors, the format earlier versions wrote ----------------------
    def state_dict(self) -> dict[str, Tensor]:
        """Every accumulator on the CPU: top/median_sum float64, channel/position/n_seqs int64, (L,)."""
        state = self._base
        for acc in self._live.values():
            state = _combine(state, _to_cpu(acc))
        return {key: value.clone() for key, value in state.items()}

    def load_state_dict(self, state: dict[str, Tensor]) -> None:
        self._base = {key: state[key].detach().to("cpu", torch.float64 if key in _FLOAT_KEYS else torch.int64).clone()
                      for key in (*_FLOAT_KEYS, *_INT_KEYS)}
        self._live = {}

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
            n_total = int(n_seqs.sum())
            rows.append(Row(self.name, "massive_activation", None, None, float(top[seen].max()), n_total))
            rows.append(Row(self.name, "massive_activation_ratio", None, None, max(ratios.values()), n_total))
        return rows
