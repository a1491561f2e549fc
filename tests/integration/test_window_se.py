"""Standard errors over windows (issue 27 fix 4; SPEC.md "Averages", resolved 2026-12).

A value that is a mean over windows carries ``se = sd(ddof=1) / sqrt(n_windows)`` over the
windows' own means, per head and per layer. The reference here is computed from the model's own
eager attention weights, independently of the capture and of ``HeadMeans``.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

import sinkscope
from sinkscope.probes.base import HeadMeans
from sinkscope.stats.paired import fmt_pm
from tiny_models import build, random_ids

N_WINDOWS, SEQ_LEN = 6, 20


def _reference_window_means(model, ids: torch.Tensor) -> np.ndarray:
    """(L, W, H): each window's mean of p0 = w_i0 over queries i >= 1, from the eager weights."""
    with torch.no_grad():
        out = model(ids, output_attentions=True)
    per_layer = []
    for weights in out.attentions:  # (W, H, T, T), rows sum to 1 (no phantom)
        w = weights.double()
        p0 = w[:, :, 1:, 0] / w[:, :, 1:, :].sum(-1)  # (W, H, T-1)
        per_layer.append(p0.mean(-1).numpy())
    return np.stack(per_layer)


@pytest.fixture(scope="module")
def measured():
    model = build("llama")
    ids = random_ids(N_WINDOWS, SEQ_LEN, seed=3)
    result = sinkscope.measure(["p0_mass"], model, windows=ids.numpy(), batch_size=4)
    return _reference_window_means(model, ids), result.table


def test_the_table_has_an_se_column_after_every_other_column(measured):
    _, table = measured
    assert table.columns[-1] == "se" and list(table.columns[:6]) == ["probe", "metric", "layer", "head", "value", "n"]


def test_p0_mass_se_per_head_and_per_layer_matches_the_eager_weights(measured):
    means, table = measured
    rows = table[table.metric == "p0_mass"]
    L, W, H = means.shape
    assert W == N_WINDOWS
    for layer in range(L):
        for head in range(H):
            row = rows[(rows.layer == layer) & (rows["head"] == head)].iloc[0]
            assert row["value"] == pytest.approx(means[layer, :, head].mean(), abs=1e-6)
            want = means[layer, :, head].std(ddof=1) / math.sqrt(W)
            assert row["se"] == pytest.approx(want, abs=1e-6, rel=1e-5)
        layer_row = rows[(rows.layer == layer) & rows["head"].isna()].iloc[0]
        per_window = means[layer].mean(axis=1)  # (W,): each window's mean over heads
        assert layer_row["se"] == pytest.approx(per_window.std(ddof=1) / math.sqrt(W), abs=1e-6, rel=1e-5)
        assert layer_row["se"] > 0
    model_row = rows[rows.layer.isna() & rows["head"].isna()].iloc[0]
    per_window = means.mean(axis=2).mean(axis=0)  # (W,): each window's mean over the layers of its layer means
    assert model_row["value"] == pytest.approx(per_window.mean(), abs=1e-6)
    assert model_row["se"] == pytest.approx(per_window.std(ddof=1) / math.sqrt(W), abs=1e-6, rel=1e-5)
    assert (rows["n"] == W).all()  # the windows on every row, the se's unit (SPEC.md "Tables")


def test_se_survives_the_written_tables(measured, tmp_path):
    from sinkscope.store.results import read_results

    _, table = measured
    model = build("llama")
    ids = random_ids(N_WINDOWS, SEQ_LEN, seed=3)
    sinkscope.measure(["p0_mass"], model, windows=ids.numpy(), batch_size=4, out=str(tmp_path / "run"))
    import pandas as pd

    for frame in (read_results(tmp_path / "run"), pd.read_csv(tmp_path / "run" / "results.csv"),
                  pd.read_parquet(tmp_path / "run" / "results.parquet")):
        got = frame[frame.metric == "p0_mass"]["se"].to_numpy(dtype=float)
        want = table[table.metric == "p0_mass"]["se"].to_numpy(dtype=float)
        np.testing.assert_allclose(got, want, rtol=1e-7, atol=1e-12, equal_nan=True)


def test_se_is_nan_with_one_window_for_fixed_values_and_without_the_window_axis():
    acc = HeadMeans(2, 2)
    acc.add(0, torch.rand(1, 2, 5), item_dims=(0, 2))
    acc.set(1, torch.tensor([0.5, 1.5]))
    assert all(math.isnan(r.se) for r in acc.rows("p", "m"))
    acc.add(0, torch.rand(3, 2), item_dims=(0,))
    rows = {(r.layer, r.head): r.se for r in acc.rows("p", "m")}
    assert not math.isnan(rows[(0, 0)]) and math.isnan(rows[(1, 0)]) and math.isnan(rows[(None, None)])


def test_window_statistics_add_under_merge_and_a_state_round_trip():
    g = torch.Generator().manual_seed(0)
    x = torch.rand(7, 3, 4, generator=g, dtype=torch.float64)
    once = HeadMeans(1, 3)
    once.add(0, x, item_dims=(0, 2))
    a, b = HeadMeans(1, 3), HeadMeans(1, 3)
    a.add(0, x[:3], item_dims=(0, 2))
    b.add(0, x[3:], item_dims=(0, 2))
    loaded = HeadMeans(1, 3)
    loaded.load_state_dict(b.state_dict())
    a.merge(loaded)
    want = x.mean(-1).std(0, unbiased=True) / math.sqrt(7)
    for acc in (once, a):
        got = [r.se for r in acc.rows("p", "m") if r.head is not None]
        np.testing.assert_allclose(got, want.numpy(), rtol=1e-12)


def test_an_older_state_without_window_statistics_gives_nan_not_a_wrong_se():
    acc = HeadMeans(1, 2)
    acc.add(0, torch.rand(4, 2, 3), item_dims=(0, 2))
    state = {k: v for k, v in acc.state_dict().items() if k not in ("window_sums", "windows")}
    old = HeadMeans(1, 2)
    old.load_state_dict(state)
    old.add(0, torch.rand(4, 2, 3), item_dims=(0, 2))
    assert all(math.isnan(r.se) for r in old.rows("p", "m"))


def test_the_report_prints_layer_values_with_their_se_and_the_figure_draws_the_band(tmp_path, monkeypatch):
    from sinkscope.report import build_report, figures
    from sinkscope.store.results import read_results
    from report_pages import parse

    model = build("llama")
    ids = random_ids(N_WINDOWS, SEQ_LEN, seed=3)
    run = tmp_path / "run"
    sinkscope.measure(["p0_mass"], model, windows=ids.numpy(), batch_size=4, out=str(run))
    drawn = {}
    original = figures.per_layer_line

    def spy(table, metric, *args, **kwargs):
        fig = original(table, metric, *args, **kwargs)
        drawn.setdefault(metric, fig)
        return fig

    monkeypatch.setattr(figures, "per_layer_line", spy)
    page = build_report([run], out=tmp_path / "page")
    table = read_results(run)
    layer_rows = table[(table.metric == "p0_mass") & table.layer.notna() & table["head"].isna()]
    html = parse(page)
    shown = {attrs["data-metric"]: rows for attrs, rows in html.tables if attrs.get("class") == "layers"}["p0_mass"]
    cells = [r[1] for r in shown[1:]]
    assert all(" ± " in c for c in cells)
    # rounded where the se's second significant digit ends (issue 61): the se to 2 digits, the value to its place
    assert cells == [fmt_pm(v, e, missing="—") for v, e in zip(layer_rows.value, layer_rows.se)]
    np.testing.assert_allclose([float(c.split(" ± ")[1]) for c in cells], layer_rows.se.to_numpy(), rtol=0.05)
    bands = [c for c in drawn["p0_mass"].axes[0].collections if c.get_gid() == "se"]
    assert len(bands) == 1
