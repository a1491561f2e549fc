"""``HeadMeans`` (probes/base.py): ``n`` and the model row's standard error (SPEC.md "Tables", issue 61).

Every row of a mean over windows has ``n`` = the windows (not the items, not summed over heads or
layers) and an ``se`` over them, the model row too: each window's model value is its mean over the
layers of its per-layer means, kept per window, so the model row's se is their sd (n - 1) / sqrt(n).
The per-window means survive a state round trip, a merge of shares and a rolled-back batch.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from sinkscope.probes.base import HeadMeans

L, H, W, N = 3, 4, 7, 5


def _items(seed: int = 0) -> torch.Tensor:
    """(L, W, H, N) float64 per-item values."""
    return torch.rand(L, W, H, N, generator=torch.Generator().manual_seed(seed), dtype=torch.float64)


def _fed(x: torch.Tensor, windows: slice = slice(None), batch: int = 3) -> HeadMeans:
    acc = HeadMeans(L, H)
    rows = range(x.shape[1])[windows]
    for start in range(rows.start, rows.stop, batch):
        for layer in range(L):
            acc.add(layer, x[layer, start:min(start + batch, rows.stop)], item_dims=(0, 2))
    return acc


def _model_row(acc: HeadMeans, layers=None):
    return next(r for r in acc.rows("p", "m", layers=layers) if r.layer is None)


def _want_se(x: torch.Tensor, layers=range(L)) -> float:
    per_window = x[list(layers)].mean(dim=(2, 3)).mean(dim=0).numpy()  # (W,): each window's model value
    return float(per_window.std(ddof=1) / math.sqrt(len(per_window)))


def test_every_row_counts_the_windows_and_the_model_row_has_its_se():
    x = _items()
    rows = _fed(x).rows("p", "m")
    assert {r.n for r in rows} == {W}
    model = _model_row(_fed(x))
    assert model.value == pytest.approx(float(x.mean()), rel=1e-12)
    assert model.se == pytest.approx(_want_se(x), rel=1e-10)
    assert model.se < min(r.se for r in rows if r.layer is not None and r.head is None) * 2


def test_a_subset_of_layers_gets_the_se_of_its_own_mean():
    x = _items(1)
    row = _model_row(_fed(x), layers=[1, 2])
    assert row.value == pytest.approx(float(x[1:].mean()), rel=1e-12)
    assert row.se == pytest.approx(_want_se(x, [1, 2]), rel=1e-10) and row.n == W


def test_merged_shares_a_state_round_trip_and_a_rolled_back_batch_keep_the_model_se():
    x = _items(2)
    whole = _model_row(_fed(x)).se
    first, second = _fed(x, slice(0, 4)), _fed(x, slice(4, W))
    loaded = HeadMeans(L, H)
    loaded.load_state_dict(second.state_dict())  # another process's share, through its state
    first.merge(loaded)
    assert _model_row(first).se == pytest.approx(whole, rel=1e-10) and _model_row(first).n == W
    resumed = HeadMeans(L, H)
    resumed.load_state_dict(_fed(x, slice(0, 4)).state_dict())  # a checkpoint, then the rest of the windows
    saved = resumed.snapshot()
    for layer in range(L):
        resumed.add(layer, x[layer, :2] * 100, item_dims=(0, 2))  # a batch that ran out of memory ...
    resumed = saved  # ... rolled back
    for layer in range(L):
        resumed.add(layer, x[layer, 4:], item_dims=(0, 2))
    assert _model_row(resumed).se == pytest.approx(whole, rel=1e-10)


def test_no_model_se_for_fixed_layers_one_window_or_a_state_without_the_window_means():
    fixed = HeadMeans(2, H)
    fixed.set(0, torch.arange(H, dtype=torch.float64))
    fixed.set(1, torch.arange(H, dtype=torch.float64))
    assert all(math.isnan(r.se) and r.n == 1 for r in fixed.rows("p", "m"))  # a parameter: read once
    one = _fed(_items(3)[:, :1])
    assert math.isnan(_model_row(one).se) and _model_row(one).n == 1
    acc = _fed(_items(4))
    older = {k: v for k, v in acc.state_dict().items() if not k.startswith("window_layer")}
    old = HeadMeans(L, H)
    old.load_state_dict(older)  # a progress file written before the per-window layer means
    assert math.isnan(_model_row(old).se)
    assert not any(math.isnan(r.se) for r in old.rows("p", "m") if r.layer is not None)  # the rest is kept


def test_the_state_holds_each_layers_window_means_in_order():
    x = _items(5)
    state = _fed(x).state_dict()
    assert state["window_layer_kept"].tolist() == [W] * L
    np.testing.assert_allclose(state["window_layer_means"].numpy(), x.mean(dim=(2, 3)).numpy(), rtol=1e-12)
