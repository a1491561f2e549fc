"""massive_activation keeps its numbers and tie rules, and never waits for the device per layer."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest
import torch

from sinkscope.probes import stats
from sinkscope.probes.massive_activation import MassiveActivation, _float_dtype
from sync_guard import HostSyncGuard

L = 3


def _probe() -> MassiveActivation:
    return MassiveActivation(SimpleNamespace(n_layers=L))


def reference(batches: list[dict[int, np.ndarray]]) -> dict[str, dict]:
    """SPEC.md's numbers with numpy: per layer top, channel, position (first maximal entry in
    window order), ratio = top / mean over windows of the exact median |h|."""
    out = {"top": {}, "channel": {}, "position": {}, "ratio": {}, "n": {}}
    for layer in range(L):
        hs = [b[layer] for b in batches if layer in b]
        if not hs:
            continue
        mag = np.abs(np.concatenate(hs).astype(np.float64))  # (N, T, C)
        N, T, C = mag.shape
        flat = mag.reshape(N, T * C)
        index = int(np.argmax(flat.reshape(-1)))  # first maximum in (window, position, channel) order
        within = index % (T * C)
        out["top"][layer] = float(flat.max())
        out["position"][layer], out["channel"][layer] = within // C, within % C
        medians = np.median(flat.astype(np.float32), axis=1)  # float32 like the probe's mean of the middle pair
        out["ratio"][layer] = float(flat.max() / medians.astype(np.float64).mean())
        out["n"][layer] = N
    return out


def _rows_by_metric(probe: MassiveActivation) -> dict:
    return {(r.metric, r.layer): (r.value, r.n) for r in probe.rows()}


def _same_rows(a: MassiveActivation, b: MassiveActivation) -> None:
    rows_a, rows_b = _rows_by_metric(a), _rows_by_metric(b)
    assert rows_a.keys() == rows_b.keys()
    for key, (value, n) in rows_a.items():
        assert n == rows_b[key][1] and value == pytest.approx(rows_b[key][0], rel=1e-14), key


def _check(probe: MassiveActivation, expected: dict) -> None:
    rows = _rows_by_metric(probe)
    for layer, top in expected["top"].items():
        n = expected["n"][layer]
        assert rows[("massive_activation", layer)] == (top, n)
        assert rows[("massive_activation_channel", layer)] == (float(expected["channel"][layer]), n)
        assert rows[("massive_activation_position", layer)] == (float(expected["position"][layer]), n)
        value, _ = rows[("massive_activation_ratio", layer)]
        assert value == pytest.approx(expected["ratio"][layer], rel=1e-12)
    assert rows[("massive_activation", None)][0] == max(expected["top"].values())


def _batches(seed: int, sizes=(2, 1, 3), T=5, C=6, dtype=torch.float32) -> list[dict[int, torch.Tensor]]:
    g = torch.Generator().manual_seed(seed)
    return [{layer: (torch.randn(B, T, C, generator=g) * (layer + 1)).to(dtype) for layer in range(L)}
            for B in sizes]


@pytest.mark.parametrize("T, C", [(5, 6), (64, 300)])  # |h| per window sorted; selected (band or radix)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_numbers_equal_numpy(dtype, T, C):
    batches = _batches(0, T=T, C=C, dtype=dtype)
    probe = _probe()
    for batch in batches:
        for layer, h in batch.items():
            probe.residual(layer, h)
    _check(probe, reference([{l: h.float().numpy() for l, h in b.items()} for b in batches]))


def test_ties_keep_the_earliest_window_position_and_channel():
    h1 = torch.zeros(2, 4, 3)
    h1[1, 2, 1] = -9.0  # window 1, position 2, channel 1
    h1[1, 3, 0] = 9.0  # same |h| later in the same window
    h2 = torch.zeros(1, 4, 3)
    h2[0, 0, 0] = 9.0  # same |h| in a later batch
    probe = _probe()
    probe.residual(0, h1)
    probe.residual(0, h2)
    rows = _rows_by_metric(probe)
    assert rows[("massive_activation", 0)] == (9.0, 3)
    assert rows[("massive_activation_position", 0)][0] == 2.0
    assert rows[("massive_activation_channel", 0)][0] == 1.0


@pytest.mark.parametrize("T, C", [(5, 6), (64, 300)])  # |h| per window sorted; radix-selected
def test_observe_residual_makes_no_host_sync(monkeypatch, T, C):
    """As on a GPU: the CPU's band median reads sizes back on purpose (free on a CPU), so it is
    switched to the accelerators' radix select here."""
    monkeypatch.setattr(stats, "CPU_BAND", False)
    probe = _probe()
    batches = _batches(1, T=T, C=C)
    with HostSyncGuard() as guard:
        for batch in batches:
            for layer, h in batch.items():
                probe.residual(layer, h)
    assert guard.count == 0, guard.report()
    with HostSyncGuard() as guard:  # the CPU copy happens here, once for all layers
        probe.state_dict()
    assert guard.count == 2, guard.report()  # floats and integers, one copy each


def test_state_dict_format_round_trip_and_resume():
    batches = _batches(2)
    whole = _probe()
    for batch in batches:
        for layer, h in batch.items():
            whole.residual(layer, h)
    state = whole.state_dict()
    assert {k: v.dtype for k, v in state.items()} == {
        "top": torch.float64, "median_sum": torch.float64, "channel": torch.int64, "position": torch.int64,
        "n_seqs": torch.int64}
    assert all(v.shape == (L,) and v.device.type == "cpu" for v in state.values())

    resumed = _probe()  # first batch, checkpoint, fresh probe loads it, rest of the batches
    for layer, h in batches[0].items():
        resumed.residual(layer, h)
    again = _probe()
    again.load_state_dict(resumed.state_dict())
    for batch in batches[1:]:
        for layer, h in batch.items():
            again.residual(layer, h)
    _same_rows(again, whole)
    for key, value in again.state_dict().items():
        torch.testing.assert_close(value, state[key], rtol=1e-15, atol=0)


def test_merge_equals_one_pass_and_ties_keep_self():
    batches = _batches(3)
    one, first, second = _probe(), _probe(), _probe()
    for i, batch in enumerate(batches):
        for layer, h in batch.items():
            one.residual(layer, h)
            (first if i == 0 else second).residual(layer, h)
    first.merge(second)
    _same_rows(first, one)

    a, b = _probe(), _probe()
    h = torch.zeros(1, 2, 2)
    h[0, 1, 1] = 4.0
    a.residual(0, h)
    h2 = torch.zeros(1, 2, 2)
    h2[0, 0, 0] = 4.0
    b.residual(0, h2)
    a.merge(b)
    assert _rows_by_metric(a)[("massive_activation_position", 0)][0] == 1.0  # a's (earlier) tie


def test_unseen_layers_have_no_rows_and_mps_sums_in_float32():
    probe = _probe()
    probe.residual(1, torch.randn(1, 3, 4))
    assert {layer for (_, layer) in _rows_by_metric(probe)} == {1, None}
    assert _float_dtype(torch.device("mps")) == torch.float32
    assert _float_dtype(torch.device("cuda")) == torch.float64
