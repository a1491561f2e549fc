"""Tests for sinkscope.report.figures."""

from __future__ import annotations

import time
import xml.etree.ElementTree as ET
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from sinkscope.errors import SinkscopeError
from sinkscope.probes import metric_info
from sinkscope.report import figures

LABELS = figures.MetricLabels.from_docs(metric_info())  # a run's manifest hands these to the report, per page

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"
N_LAYERS, N_HEADS, N_KV_HEADS = 4, 6, 2


def _tidy(rows: list[tuple]) -> pd.DataFrame:
    df = pd.DataFrame(rows, columns=["probe", "metric", "layer", "head", "value", "n"])
    return df.astype({"layer": "Int64", "head": "Int64", "value": "float64", "n": "int64"})


def _synthetic() -> pd.DataFrame:
    """4 layers x 6 heads p0_mass (+ layer and model aggregates), 4 x 2 value_norm_ratio,
    layer-only massive_activation, model-only sink_rate."""
    rng = np.random.default_rng(1234)
    rows: list[tuple] = []
    for layer in range(N_LAYERS):
        vals = rng.uniform(0.0, 1.0, N_HEADS)
        if layer == 2:
            vals[3] = np.nan
        for head, v in enumerate(vals):
            rows.append(("attention", "p0_mass", layer, head, float(v), 32))
        rows.append(("attention", "p0_mass", layer, pd.NA, float(np.nanmean(vals)), 32 * N_HEADS))
        for head in range(N_KV_HEADS):
            rows.append(("values", "value_norm_ratio", layer, head, float(rng.uniform(0.05, 0.5)), 32))
        rows.append(("hidden", "massive_activation", layer, pd.NA, float(rng.uniform(1, 500)), 32))
    rows.append(("attention", "p0_mass", pd.NA, pd.NA, 0.4, 32 * N_HEADS * N_LAYERS))
    rows.append(("attention", "sink_rate", pd.NA, pd.NA, 0.25, N_HEADS * N_LAYERS))
    return _tidy(rows)


@pytest.fixture()
def tidy() -> pd.DataFrame:
    return _synthetic()


def _expected_grid(df: pd.DataFrame, metric: str) -> np.ndarray:
    sub = df[(df["metric"] == metric) & df["layer"].notna() & df["head"].notna()]
    grid = sub.pivot(index="layer", columns="head", values="value").sort_index().sort_index(axis=1)
    return grid.to_numpy(dtype="float64")


def _assert_valid_png(path: Path) -> None:
    assert path.read_bytes()[:8] == PNG_MAGIC


def _assert_valid_svg(path: Path) -> None:
    root = ET.parse(path).getroot()
    assert root.tag.endswith("svg")


# --- write_run_figures -------------------------------------------------------


def test_write_run_figures_writes_expected_files(tidy: pd.DataFrame, tmp_path: Path) -> None:
    paths = figures.write_run_figures(tidy, tmp_path)
    fig_dir = tmp_path / "figures"
    expected = {
        fig_dir / f"{kind}_{metric}.{ext}"
        for kind, metric in [
            ("heatmap", "p0_mass"),
            ("heatmap", "value_norm_ratio"),
            ("layers", "p0_mass"),
            ("layers", "massive_activation"),
        ]
        for ext in ("png", "svg")
    }
    assert set(paths) == expected
    assert len(paths) == len(expected)
    # Only the expected files: no leftover temp files, nothing for model-only metrics.
    assert set(fig_dir.iterdir()) == expected
    for path in paths:
        if path.suffix == ".png":
            _assert_valid_png(path)
        else:
            _assert_valid_svg(path)


def test_write_run_figures_empty_table(tmp_path: Path) -> None:
    assert figures.write_run_figures(_tidy([]), tmp_path) == []


def test_write_run_figures_missing_column(tidy: pd.DataFrame, tmp_path: Path) -> None:
    with pytest.raises(SinkscopeError, match="head"):
        figures.write_run_figures(tidy.drop(columns="head"), tmp_path)


# --- layer_head_heatmap ------------------------------------------------------


@pytest.mark.parametrize(
    ("metric", "shape"),
    [("p0_mass", (N_LAYERS, N_HEADS)), ("value_norm_ratio", (N_LAYERS, N_KV_HEADS))],
)
def test_heatmap_data_matches_pivot(tidy: pd.DataFrame, metric: str, shape: tuple[int, int]) -> None:
    fig = figures.layer_head_heatmap(tidy, metric)
    ax = fig.axes[0]
    arr = ax.images[0].get_array()
    expected = _expected_grid(tidy, metric)
    assert arr.shape == shape == expected.shape
    np.testing.assert_array_equal(np.ma.getmaskarray(arr), np.isnan(expected))
    np.testing.assert_allclose(arr.filled(np.nan), expected, equal_nan=True)


def test_heatmap_nan_cell_is_masked(tidy: pd.DataFrame) -> None:
    arr = figures.layer_head_heatmap(tidy, "p0_mass").axes[0].images[0].get_array()
    assert np.ma.getmaskarray(arr)[2, 3]
    assert np.ma.getmaskarray(arr).sum() == 1


def test_heatmap_labels_orientation_and_colourbar(tidy: pd.DataFrame) -> None:
    fig = figures.layer_head_heatmap(tidy, "p0_mass", title="custom", vmin=0, vmax=1, cmap="cividis", labels=LABELS)
    ax, cax = fig.axes[0], fig.axes[1]
    assert ax.get_xlabel() == "head"
    assert ax.get_ylabel() == "layer"
    assert ax.get_title() == "custom"
    # Layer 0 at the top: the y axis is inverted.
    bottom, top = ax.get_ylim()
    assert top < bottom
    assert top == pytest.approx(-0.5) and bottom == pytest.approx(N_LAYERS - 0.5)
    im = ax.images[0]
    assert im.get_clim() == (0, 1)
    assert im.get_cmap().name.startswith("cividis")
    label, unit = LABELS.names["p0_mass"]
    # Short figure: the unit goes on a second line.
    assert cax.get_ylabel() == f"{label}\n({unit})"
    assert figures.metric_axis_label("p0_mass", LABELS) == f"{label} ({unit})"
    # The NaN cell gets a legend entry.
    assert [t.get_text() for t in fig.legends[0].get_texts()] == ["no data (NaN)"]


def test_heatmap_without_nan_has_no_nan_legend(tidy: pd.DataFrame) -> None:
    assert not figures.layer_head_heatmap(tidy, "value_norm_ratio").legends


def test_heatmap_kv_head_axis(tidy: pd.DataFrame) -> None:
    ax = figures.layer_head_heatmap(tidy, "value_norm_ratio", labels=LABELS).axes[0]
    assert ax.get_xlabel() == "KV head"  # its documentation says "layer x KV head"
    assert figures.layer_head_heatmap(tidy, "p0_mass", labels=LABELS).axes[0].get_xlabel() == "head"


def test_labels_come_only_from_what_the_figure_is_handed(tidy: pd.DataFrame) -> None:
    """No module-level registry: a figure drawn without labels names the metric, whatever was drawn before."""
    assert not hasattr(figures, "METRIC_LABELS") and not hasattr(figures, "register_metric_docs")
    figures.layer_head_heatmap(tidy, "value_norm_ratio", labels=LABELS)
    plain = figures.layer_head_heatmap(tidy, "value_norm_ratio")
    assert plain.axes[0].get_xlabel() == "head" and plain.axes[1].get_ylabel() == "value_norm_ratio"
    assert figures.per_layer_line(tidy, "p0_mass").axes[0].get_ylabel() == "p0_mass"
    own = figures.MetricLabels({"p0_mass": ("mine", "units")}, frozenset({"p0_mass"}))
    assert figures.per_layer_line(tidy, "p0_mass", labels=own).axes[0].get_ylabel() == "mine (units)"
    assert figures.layer_head_heatmap(tidy, "p0_mass", labels=own).axes[0].get_xlabel() == "KV head"


def test_heatmap_unknown_metric_label_falls_back_to_name() -> None:
    df = _tidy([("p", "my_metric", 0, 0, 1.0, 1), ("p", "my_metric", 0, 1, 2.0, 1)])
    fig = figures.layer_head_heatmap(df, "my_metric")
    assert fig.axes[1].get_ylabel() == "my_metric"


def test_heatmap_fills_gaps_in_index() -> None:
    df = _tidy([("p", "m", 0, 0, 1.0, 1), ("p", "m", 2, 3, 2.0, 1)])
    arr = figures.layer_head_heatmap(df, "m").axes[0].images[0].get_array()
    assert arr.shape == (3, 4)
    assert np.ma.getmaskarray(arr).sum() == 10
    assert arr[0, 0] == 1.0 and arr[2, 3] == 2.0


def test_heatmap_all_nan_renders(tmp_path: Path) -> None:
    df = _tidy([("p", "m", 0, 0, np.nan, 1), ("p", "m", 1, 1, np.nan, 1)])
    fig = figures.layer_head_heatmap(df, "m")
    assert np.ma.getmaskarray(fig.axes[0].images[0].get_array()).all()
    for path in figures.save_figure(fig, tmp_path / "allnan"):
        assert path.stat().st_size > 0


def test_heatmap_without_per_head_rows_raises(tidy: pd.DataFrame) -> None:
    with pytest.raises(SinkscopeError, match="massive_activation"):
        figures.layer_head_heatmap(tidy, "massive_activation")


def test_heatmap_duplicate_cells_raise(tidy: pd.DataFrame) -> None:
    doubled = pd.concat([tidy, tidy.assign(probe="other")], ignore_index=True)
    with pytest.raises(SinkscopeError, match="several rows"):
        figures.layer_head_heatmap(doubled, "p0_mass")


def test_large_heatmap_is_fast_and_small(tmp_path: Path) -> None:
    n_layers, n_heads = 36, 64
    rng = np.random.default_rng(0)
    layer, head = np.meshgrid(np.arange(n_layers), np.arange(n_heads), indexing="ij")
    values = rng.beta(1, 5, size=(n_layers, n_heads))
    values[5, 7] = np.nan
    df = pd.DataFrame(
        {
            "probe": "attention",
            "metric": "p0_mass",
            "layer": pd.array(layer.ravel(), dtype="Int64"),
            "head": pd.array(head.ravel(), dtype="Int64"),
            "value": values.ravel(),
            "n": np.int64(16),
        }
    )
    start = time.perf_counter()
    fig = figures.layer_head_heatmap(df, "p0_mass")
    png, svg = figures.save_figure(fig, tmp_path / "big")
    elapsed = time.perf_counter() - start
    assert elapsed < 5.0
    assert png.stat().st_size < 1_000_000
    _assert_valid_png(png)
    _assert_valid_svg(svg)
    ax = fig.axes[0]
    # Tick labels are thinned: far fewer than one per row/column.
    assert 2 <= len([t for t in ax.get_xticks() if -0.5 <= t <= n_heads - 0.5]) <= 20
    assert 2 <= len([t for t in ax.get_yticks() if -0.5 <= t <= n_layers - 0.5]) <= 20
    # Figure grows with the grid but stays bounded.
    width, height = fig.get_size_inches()
    small_w, small_h = figures.layer_head_heatmap(_synthetic(), "p0_mass").get_size_inches()
    assert width > small_w and height > small_h
    assert width <= 12 and height <= 9
    # Tall enough for the colourbar label on one line.
    assert "\n" not in fig.axes[1].get_ylabel()


# --- per_layer_line -----------------------------------------------------------


def _layer_aggregates(df: pd.DataFrame, metric: str) -> pd.DataFrame:
    sub = df[(df["metric"] == metric) & df["layer"].notna() & df["head"].isna()]
    return sub.sort_values("layer")


def test_line_data_matches_layer_aggregates(tidy: pd.DataFrame) -> None:
    fig = figures.per_layer_line(tidy, "p0_mass", labels=LABELS)
    ax = fig.axes[0]
    expected = _layer_aggregates(tidy, "p0_mass")
    line = ax.lines[0]
    np.testing.assert_array_equal(np.asarray(line.get_xdata()), expected["layer"].to_numpy(dtype="int64"))
    np.testing.assert_allclose(np.asarray(line.get_ydata()), expected["value"].to_numpy())
    assert ax.get_xlabel() == "layer"
    assert "share of real-key mass" in ax.get_ylabel()


def test_line_band_spans_head_min_max(tidy: pd.DataFrame) -> None:
    ax = figures.per_layer_line(tidy, "p0_mass").axes[0]
    assert len(ax.collections) == 1
    heads = tidy[(tidy["metric"] == "p0_mass") & tidy["head"].notna()]
    lo = heads.groupby("layer")["value"].min().to_numpy()
    hi = heads.groupby("layer")["value"].max().to_numpy()
    verts = np.concatenate([p.vertices for p in ax.collections[0].get_paths()])
    assert verts[:, 1].min() == pytest.approx(lo.min())
    assert verts[:, 1].max() == pytest.approx(hi.max())


def test_line_without_heads_has_no_band(tidy: pd.DataFrame) -> None:
    ax = figures.per_layer_line(tidy, "massive_activation").axes[0]
    assert len(ax.lines) == 1
    assert len(ax.collections) == 0
    expected = _layer_aggregates(tidy, "massive_activation")["value"].to_numpy()
    np.testing.assert_allclose(np.asarray(ax.lines[0].get_ydata()), expected)


def test_line_draws_a_band_of_one_standard_error_where_the_layer_rows_have_one(tidy: pd.DataFrame) -> None:
    """Issue 27 fix 4: value ± 1 se over windows, a band of its own beside the min-max over heads."""
    layer_rows = tidy["head"].isna() & tidy["layer"].notna() & (tidy["metric"] == "p0_mass")
    se = np.where(layer_rows, 0.01 * (tidy["layer"].fillna(0).to_numpy(dtype=float) + 1), np.nan)
    se[np.flatnonzero(layer_rows)[1]] = np.nan  # layer 1: no se, no band there
    ax = figures.per_layer_line(tidy.assign(se=se), "p0_mass").axes[0]
    bands = [c for c in ax.collections if c.get_gid() == "se"]
    assert len(bands) == 1 and len(ax.collections) == 2
    verts = np.concatenate([p.vertices for p in bands[0].get_paths()])
    layers = tidy[layer_rows].sort_values("layer")
    for layer, value in zip(layers["layer"], layers["value"]):
        at = verts[np.isclose(verts[:, 0], layer), 1]
        if layer == 1:
            assert at.size == 0
        else:
            width = 0.01 * (layer + 1)
            assert at.min() == pytest.approx(value - width) and at.max() == pytest.approx(value + width)
    assert any("s.e. over windows" in t.get_text() for t in ax.get_legend().get_texts())


def test_line_without_se_draws_no_se_band(tidy: pd.DataFrame) -> None:
    ax = figures.per_layer_line(tidy.assign(se=np.nan), "p0_mass").axes[0]
    assert not [c for c in ax.collections if c.get_gid() == "se"]


def test_line_overlay_on_existing_axes(tidy: pd.DataFrame) -> None:
    fig = figures.per_layer_line(tidy, "p0_mass", label="run A")
    other = tidy.assign(value=tidy["value"] * 0.5)
    fig2 = figures.per_layer_line(other, "p0_mass", label="run B", ax=fig.axes[0])
    assert fig2 is fig
    ax = fig.axes[0]
    assert len(ax.lines) == 2
    assert ax.lines[0].get_color() != ax.lines[1].get_color()
    legend_texts = [t.get_text() for t in ax.get_legend().get_texts()]
    assert "run A" in legend_texts and "run B" in legend_texts
    np.testing.assert_allclose(
        np.asarray(ax.lines[1].get_ydata()), _layer_aggregates(other, "p0_mass")["value"].to_numpy()
    )


def test_line_without_aggregates_raises(tidy: pd.DataFrame) -> None:
    with pytest.raises(SinkscopeError, match="value_norm_ratio"):
        figures.per_layer_line(tidy, "value_norm_ratio")


# --- save_figure ---------------------------------------------------------------


def test_save_figure_atomic_and_deterministic(tidy: pd.DataFrame, tmp_path: Path) -> None:
    fig = figures.layer_head_heatmap(tidy, "p0_mass")
    out = tmp_path / "sub" / "fig"
    paths = figures.save_figure(fig, out)
    assert paths == [tmp_path / "sub" / "fig.png", tmp_path / "sub" / "fig.svg"]
    first = [p.read_bytes() for p in paths]
    # Re-rendering a fresh, identical figure replaces the files with identical bytes.
    figures.save_figure(figures.layer_head_heatmap(tidy, "p0_mass"), out)
    assert [p.read_bytes() for p in paths] == first
    assert b"<dc:date>" not in first[1]
    assert sorted(p.name for p in (tmp_path / "sub").iterdir()) == ["fig.png", "fig.svg"]


def test_no_pyplot_figures_leak(tidy: pd.DataFrame, tmp_path: Path) -> None:
    import matplotlib.pyplot as plt

    before = plt.get_fignums()
    figures.write_run_figures(tidy, tmp_path)
    assert plt.get_fignums() == before


def test_rcparams_not_modified(tidy: pd.DataFrame, tmp_path: Path) -> None:
    import matplotlib

    before = dict(matplotlib.rcParams)
    figures.write_run_figures(tidy, tmp_path)
    assert dict(matplotlib.rcParams) == before


def test_metric_labels_cover_known_metrics() -> None:
    for metric in ("p0_mass", "sink_rate", "phantom_mass", "value_norm_ratio", "massive_activation"):
        label, unit = LABELS.names[metric]
        assert label and unit
    assert LABELS.names["p0_mass"][1] == "share of real-key mass"
    assert LABELS.names["phantom_mass"][1] == "share of row mass"
    assert LABELS.names["sink_rate"][1] == "fraction of heads"
    assert figures.metric_axis_label("unknown", LABELS) == "unknown"
