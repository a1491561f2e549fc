"""``report/circuit.py``: the report entries of ``sinkscope circuit``, built from hand-made results tables.

Each table is a list of ``Row`` objects shaped as the circuit probes write them (condition columns
``position``, ``subtracted``, ``point``, ``window``, ``where``, ``rank``, ``bos``, ``repeat``),
written to ``tmp_path`` as a run's ``results.parquet`` (or ``results.csv``) and read back with
``read_results``, the way the report reads a run. The reference is that list of rows: every
number a summary, a figure line or a table cell shows must be the row's value (table cells carry
4 significant digits), the right lines, panels and rows must appear, and missing measurements must
give empty tables or notes rather than errors. No model runs and no figure is saved.
"""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest

from sinkscope.report import circuit
from sinkscope.report.page import Page
from sinkscope.report.runs import RunData
from sinkscope.store.results import Row, read_results, rows_to_frame

LAYERS, HEADS, T = 3, 2, 20
CELL = 5e-4  # a table cell shows 4 significant digits


class Table:
    """The rows of one run, with lookups by metric and conditions (the test's reference)."""

    def __init__(self, rows: list[Row]):
        self.rows = rows

    def value(self, metric: str, layer=None, head=None, **conditions) -> float:
        found = [r.value for r in self.rows if r.metric == metric and r.layer == layer and r.head == head
                 and all(dict(r.conditions).get(k) == v for k, v in conditions.items())]
        assert len(found) == 1, (metric, layer, head, conditions)
        return found[0]

    def curve(self, metric: str, head=None) -> list[float]:
        found = sorted((dict(r.conditions)["position"], r.value) for r in self.rows
                       if r.metric == metric and r.head == head and "position" in dict(r.conditions))
        return [v for _, v in found]


def circuit_rows(seed: int, *, pca: bool = True, bos: bool = True) -> Table:
    """A circuit run's rows: norms, cosines, one layer's norm curves, PCA, outliers, BOS experiment."""
    rng = np.random.default_rng(seed)
    rows: list[Row] = []
    for layer in range(LAYERS):
        p0, other = rng.uniform(1.0, 50.0), rng.uniform(1.0, 5.0)
        rows += [Row("p0_norm", "p0_norm", layer, None, p0, 4), Row("p0_norm", "other_norm", layer, None, other, 4),
                 Row("p0_norm", "p0_norm_ratio", layer, None, p0 / other, 4),
                 Row("p0_norm", "p0_cosine", layer, None, rng.uniform(0.0, 1.0), 12),
                 Row("p0_norm", "later_cosine", layer, None, rng.uniform(-0.2, 1.0), 12, (("position", 8),))]
    rows.append(Row("p0_norm", "p0_norm_separates", None, None, 1.0, 4))
    for head in [*range(HEADS), None]:
        curve = rng.uniform(0.5, 3.0, size=T)
        rows += [Row("attn_out_norm", "attn_z_norm", 0, head, v, 4, (("position", t),)) for t, v in enumerate(curve)]
        rows += [Row("attn_out_norm", "attn_z_norm_p0_ratio", 0, head, rng.uniform(0.5, 3.0), 4),
                 Row("attn_out_norm", "attn_z_norm_trend", 0, head, rng.uniform(-0.5, 0.1), 4)]
    after = rng.uniform(1.0, 9.0, size=T)
    rows += [Row("attn_out_norm", "attn_out_norm", 0, None, v, 4, (("position", t),)) for t, v in enumerate(after)]
    rows += [Row("attn_out_norm", "attn_out_norm_p0_ratio", 0, None, rng.uniform(0.5, 3.0), 4),
             Row("attn_out_norm", "attn_out_norm_trend", 0, None, rng.uniform(-0.5, 0.1), 4)]
    if pca:
        points = [(0, 0), (0, 1), (0, 5), (1, 0), (2, 0), (3, 0)]  # (window, position)
        for cond in ("none", "0.1"):
            c = (("subtracted", cond),)
            rows += [Row("mlp_pca_up", "pca_separation", 0, None, rng.uniform(0.5, 9.0), 80, c),
                     Row("mlp_pca_up", "pca_explained_pc1", 0, None, rng.uniform(0.2, 0.6), 80, c),
                     Row("mlp_pca_up", "pca_explained_pc2", 0, None, rng.uniform(0.05, 0.2), 80, c),
                     Row("mlp_pca_up", "pca_separation_best", 0, None, rng.uniform(9.0, 20.0), 80, c),
                     Row("mlp_pca_up", "pca_separation_best_pc", 0, None, float(rng.integers(1, 11)), 80, c)]
            for i, (w, t) in enumerate(points):
                point = (*c, ("point", i), ("window", w), ("position", t))
                rows += [Row("mlp_pca_up", "pca_scatter_pc1", 0, None, rng.normal(), 1, point),
                         Row("mlp_pca_up", "pca_scatter_pc2", 0, None, rng.normal(), 1, point)]
    for where in ("resid_pre", "normed"):
        for layer in range(LAYERS):
            z = sorted(rng.normal(0.0, 20.0, size=3), key=abs, reverse=True)
            rows.append(Row("p0_outliers", "p0_outlier_max_z", layer, None, abs(z[0]), 4, (("where", where),)))
            for rank, value in enumerate(z, start=1):
                cond = (("where", where), ("rank", rank))
                rows += [Row("p0_outliers", "p0_outlier_z", layer, None, value, 4, cond),
                         Row("p0_outliers", "p0_outlier_channel", layer, None, float(rng.integers(0, 64)), 4, cond)]
    if bos:
        for setting in ("with", "without"):
            cond = (("bos", setting),)
            hits = rng.uniform(0.0, 1.0, size=(LAYERS, HEADS))
            for layer in range(LAYERS):
                rows += [Row("bos_experiment", "bos_sink_rate", layer, h, hits[layer, h], 4, cond)
                         for h in range(HEADS)]
                rows.append(Row("bos_experiment", "bos_sink_rate", layer, None, hits[layer].mean(), 8, cond))
            rows += [Row("bos_experiment", "bos_sink_rate", None, None, hits.mean(), 24, cond),
                     Row("bos_experiment", "bos_sink_rate_from_layer", None, None, hits[2:].mean(), 8,
                         cond + (("layer_start", 2),))]
            base = rng.uniform(2.0, 5.0)
            for r in (1, 2, 4):
                loss = base if r == 1 else base + rng.uniform(-0.5, 0.5)
                cond_r = (("bos", setting), ("repeat", r))
                rows += [Row("bos_experiment", "bos_repeat_loss", None, None, loss, 60, cond_r),
                         Row("bos_experiment", "bos_repeat_loss_delta", None, None, loss - base, 60, cond_r)]
    return Table(rows)


def make_run(folder: Path, table: Table, label: str, *, fmt: str = "parquet", bos_id=None) -> RunData:
    """A run as the report holds it: the table written to ``folder`` and read back."""
    folder.mkdir(parents=True, exist_ok=True)
    frame = rows_to_frame(table.rows)
    if fmt == "parquet":
        frame.to_parquet(folder / "results.parquet", index=False)
    else:
        frame.to_csv(folder / "results.csv", index=False, float_format="%.9g")
    manifest = {"windows": {"seq_len": T, "bos_id": bos_id}}
    return RunData(folder, label, manifest, read_results(folder))


class Keeper:
    """``keep(fig, stem, title)`` that remembers the figures instead of saving them."""

    def __init__(self):
        self.kept: list[tuple] = []

    def __call__(self, fig, stem: str, title: str) -> dict:
        self.kept.append((fig, stem, title))
        return {"stem": stem, "title": title}

    def lines(self, index: int = 0, axis: int = 0):
        return self.kept[index][0].axes[axis].lines


def cell(text: str) -> float:
    return math.nan if text == "—" else float(text)


def assert_cells(cells, values) -> None:
    np.testing.assert_allclose([cell(c) for c in cells], values, rtol=CELL)


@pytest.fixture
def one(tmp_path) -> tuple[Table, RunData]:
    table = circuit_rows(0)
    return table, make_run(tmp_path / "a", table, "a")


def entry(runs, metric):
    """The metric's page entry through the section protocol (``circuit.entry(page, metric)``)."""
    keep = Keeper()
    return circuit.entry(Page(runs, Path("unused"), keep=keep), metric), keep


# ---- what the module draws, and the summary ------------------------------------------------------------


def test_every_drawn_metric_has_a_summary_label_and_folded_ones_are_handled():
    assert set(circuit.SUMMARY_LABEL) == set(circuit.DRAWN)
    assert all(circuit.handles("circuit", m, []) for m in (*circuit.DRAWN, *circuit.FOLDED))
    assert not circuit.handles("p0_mass", "p0_mass", []) and not circuit.handles("sink_rate", "sink_rate", [])
    assert not set(circuit.DRAWN) & set(circuit.FOLDED)


@pytest.mark.parametrize("fmt", ["parquet", "csv"])
def test_summary_values_are_the_designated_rows(tmp_path, fmt):
    table = circuit_rows(1)
    run = make_run(tmp_path / "a", table, "a", fmt=fmt)
    want = {
        "p0_norm": table.value("p0_norm_separates"),
        "p0_cosine": table.value("p0_cosine", layer=LAYERS - 1),
        "attn_z_norm": table.value("attn_z_norm_p0_ratio", layer=0),
        "attn_out_norm": table.value("attn_out_norm_p0_ratio", layer=0),
        "pca_separation": table.value("pca_separation", layer=0, subtracted="none"),
        "p0_outlier_max_z": max(r.value for r in table.rows if r.metric == "p0_outlier_max_z"),
        "bos_sink_rate": table.value("bos_sink_rate", bos="without"),
        "bos_repeat_loss_delta": table.value("bos_repeat_loss_delta", bos="without", repeat=4),
    }
    for metric, value in want.items():
        assert circuit.summary_value(run.table, metric) == pytest.approx(value, rel=1e-8), metric
    assert circuit.summary_value(run.table, "other_norm") is None  # a folded metric has no summary row


def test_an_entry_adds_its_summary_row_and_a_folded_metric_has_no_entry(tmp_path):
    table = circuit_rows(1)
    runs = [make_run(tmp_path / "a", table, "a"), make_run(tmp_path / "b", table, "b")]
    page = Page(runs, Path("unused"), keep=Keeper())
    assert circuit.entry(page, "other_norm") is None and page.summary == []
    out = circuit.entry(page, "p0_norm")
    assert out["metric"] == "p0_norm" and out["figures"]
    (row,) = page.summary
    assert row["metric"] == "p0_norm" and row["label"] == circuit.SUMMARY_LABEL["p0_norm"]
    assert row["values"] == [f"{table.value('p0_norm_separates'):.6g}"] * 2  # page.fmt: 6 significant digits
    assert circuit.note("circuit", ["p0_norm"]) is None and circuit.tables(page, "circuit") == []


def test_summary_values_of_a_table_without_circuit_rows_are_none(tmp_path):
    run = make_run(tmp_path / "x", Table([Row("p0_mass", "p0_mass", 0, None, 0.5, 10),
                                          Row("p0_mass", "p0_mass", None, None, 0.5, 10)]), "x")
    assert all(circuit.summary_value(run.table, metric) is None for metric in circuit.DRAWN)


# ---- the entries ---------------------------------------------------------------------------------------


def test_norms_entry_draws_and_tabulates_the_per_layer_norms(one):
    table, run = one
    out, keep = entry([run], "p0_norm")
    assert [stem for _, stem, _ in keep.kept] == ["circuit_norms", "circuit_norm_ratio"]
    assert out["figures"] == [{"stem": s, "title": t} for _, s, t in keep.kept]
    p0_line, other_line = keep.lines(0)
    layers = list(range(LAYERS))
    np.testing.assert_array_equal(p0_line.get_xdata(), layers)
    np.testing.assert_allclose(p0_line.get_ydata(), [table.value("p0_norm", l) for l in layers], rtol=1e-12)
    np.testing.assert_allclose(other_line.get_ydata(), [table.value("other_norm", l) for l in layers], rtol=1e-12)
    np.testing.assert_allclose(keep.lines(1)[0].get_ydata(), [table.value("p0_norm_ratio", l) for l in layers],
                               rtol=1e-12)
    assert keep.kept[0][0].axes[0].get_yscale() == "log"
    assert out["table"]["columns"] == ["layer", "p0 norm", "median other", "ratio"]
    body = out["table"]["rows"]
    assert [row[0] for row in body] == [str(l) for l in layers]
    for row, layer in zip(body, layers):
        assert_cells(row[1:], [table.value(m, layer) for m in ("p0_norm", "other_norm", "p0_norm_ratio")])
    assert "a: layer 1" in out["note"]


def test_cosines_entry_names_the_later_position_and_warns_about_bos(tmp_path, one):
    table, run = one
    out, keep = entry([run], "p0_cosine")
    p0_line, later_line = keep.lines(0)
    assert later_line.get_label() == "position 8"
    np.testing.assert_allclose(p0_line.get_ydata(), [table.value("p0_cosine", l) for l in range(LAYERS)], rtol=1e-12)
    np.testing.assert_allclose(later_line.get_ydata(), [table.value("later_cosine", l, position=8)
                                                        for l in range(LAYERS)], rtol=1e-12)
    for row, layer in zip(out["table"]["rows"], range(LAYERS)):
        assert_cells(row[1:], [table.value("p0_cosine", layer), table.value("later_cosine", layer, position=8)])
    assert out["note"] is None  # no BOS: nothing to warn about
    with_bos = make_run(tmp_path / "b", table, "b", bos_id=0)
    assert "BOS" in entry([with_bos], "p0_cosine")[0]["note"]


def test_attn_z_entry_draws_each_curve_over_its_mean_after_position_0(one):
    table, run = one
    out, keep = entry([run], "attn_z_norm")
    assert [stem for _, stem, _ in keep.kept] == ["circuit_attn_z_norm"]
    lines = keep.lines(0)
    assert len(lines) == HEADS + 3  # a thin line per head, the pooled curve, position 0's dot, the dashed 1
    np.testing.assert_array_equal(lines[-1].get_ydata(), [1.0, 1.0])
    for line, head in zip(lines, [*range(HEADS), None]):
        curve = np.array(table.curve("attn_z_norm", head))
        np.testing.assert_array_equal(line.get_xdata(), np.arange(T))
        np.testing.assert_allclose(line.get_ydata(), curve / curve[1:].mean(), rtol=1e-12)
    pooled = np.array(table.curve("attn_z_norm"))
    np.testing.assert_allclose(lines[-2].get_ydata(), [pooled[0] / pooled[1:].mean()], rtol=1e-12)
    body = out["table"]["rows"]
    assert [row[1] for row in body] == ["pooled", *[str(h) for h in range(HEADS)]]
    for row, head in zip(body, [None, *range(HEADS)]):
        assert row[0] == "a"
        assert_cells(row[2:], [table.value("attn_z_norm_p0_ratio", 0, head), table.value("attn_z_norm_trend", 0, head)])
    above = sum(table.value("attn_z_norm_p0_ratio", 0, h) > 1 for h in range(HEADS))
    assert f"{above} of {HEADS} heads above 1" in out["note"]


def test_attn_out_entry_tabulates_positions_0_to_7_powers_of_two_and_the_last(one):
    table, run = one
    out, keep = entry([run], "attn_out_norm")
    line, dot = keep.lines(0)
    np.testing.assert_allclose(line.get_ydata(), table.curve("attn_out_norm"), rtol=1e-12)  # absolute, not relative
    shown = [0, 1, 2, 3, 4, 5, 6, 7, 8, 16, T - 1]
    body = out["table"]["rows"]
    assert [int(row[0]) for row in body] == shown
    z, after = table.curve("attn_z_norm"), table.curve("attn_out_norm")
    for row, t in zip(body, shown):
        assert_cells(row[1:], [z[t], after[t]])
    assert out["table"]["collapsed"] is False


def test_pca_entry_has_a_panel_per_subtraction_and_a_row_of_scores(tmp_path, one):
    table, run = one
    out, keep = entry([run], "pca_separation")
    (fig, stem, _), = keep.kept
    assert stem == "circuit_pca_scatter" and len(fig.axes) == 2
    for ax, cond in zip(fig.axes, ("none", "0.1")):
        assert f"subtracted: {cond}" in ax.get_title()
        others, zero = ax.collections[0].get_offsets(), ax.collections[1].get_offsets()  # grey, then red
        pc1 = {dict(r.conditions)["point"]: r.value for r in table.rows if r.metric == "pca_scatter_pc1"
               and dict(r.conditions)["subtracted"] == cond}
        pc2 = {dict(r.conditions)["point"]: r.value for r in table.rows if r.metric == "pca_scatter_pc2"
               and dict(r.conditions)["subtracted"] == cond}
        position = {dict(r.conditions)["point"]: dict(r.conditions)["position"] for r in table.rows
                    if r.metric == "pca_scatter_pc1" and dict(r.conditions)["subtracted"] == cond}
        want_zero = [(pc1[p], pc2[p]) for p in sorted(pc1) if position[p] == 0]
        want_others = [(pc1[p], pc2[p]) for p in sorted(pc1) if position[p] != 0]
        np.testing.assert_allclose(np.asarray(zero), want_zero, rtol=1e-12)
        np.testing.assert_allclose(np.asarray(others), want_others, rtol=1e-12)
    body = out["table"]["rows"]
    assert [row[:2] for row in body] == [["a", "none"], ["a", "0.1"]]
    for row in body:
        cond = row[1]
        assert_cells([row[2], row[4], row[5]], [table.value(m, 0, subtracted=cond) for m in
                                                 ("pca_separation", "pca_explained_pc1", "pca_explained_pc2")])
        best, which = row[3].split(" (PC")
        assert_cells([best, which.rstrip(")")], [table.value("pca_separation_best", 0, subtracted=cond),
                                                 table.value("pca_separation_best_pc", 0, subtracted=cond)])
        assert row[6] == "80"
    assert out["note"] is None


def test_pca_entry_names_a_run_without_a_pca(tmp_path, one):
    table, run = one
    no_pca = make_run(tmp_path / "moe", circuit_rows(2, pca=False), "moe")
    both, keep = entry([run, no_pca], "pca_separation")
    assert both["note"] == "No PCA for moe (a mixture-of-experts MLP has no pre-activation point)."
    assert len(keep.kept[0][0].axes) == 2 and [row[0] for row in both["table"]["rows"]] == ["a", "a"]


def test_outliers_entry_lists_the_top_channels_in_rank_order(one):
    table, run = one
    out, keep = entry([run], "p0_outlier_max_z")
    before, after = keep.lines(0)
    np.testing.assert_allclose(before.get_ydata(), [table.value("p0_outlier_max_z", l, where="resid_pre")
                                                    for l in range(LAYERS)], rtol=1e-12)
    np.testing.assert_allclose(after.get_ydata(), [table.value("p0_outlier_max_z", l, where="normed")
                                                   for l in range(LAYERS)], rtol=1e-12)
    body = out["table"]["rows"]
    assert len(body) == 2 * LAYERS
    for run_label, layer, where, text in body:
        assert run_label == "a"
        channels = [int(part.split(" (")[0]) for part in text.split(", ")]
        zs = [float(part.split(" (")[1].rstrip(")")) for part in text.split(", ")]
        assert channels == [int(table.value("p0_outlier_channel", int(layer), where=where, rank=k)) for k in (1, 2, 3)]
        np.testing.assert_allclose(zs, [table.value("p0_outlier_z", int(layer), where=where, rank=k)
                                        for k in (1, 2, 3)], rtol=5e-3)  # 3 significant digits
    assert {(row[1], row[2]) for row in body} == {(str(l), w) for l in range(LAYERS) for w in ("resid_pre", "normed")}


def test_bos_entries_show_the_sink_rate_and_loss_change_per_setting(one):
    table, run = one
    out, keep = entry([run], "bos_sink_rate")
    with_line, without_line = keep.lines(0)
    for line, setting in ((with_line, "with"), (without_line, "without")):
        np.testing.assert_allclose(line.get_ydata(), [table.value("bos_sink_rate", l, bos=setting)
                                                      for l in range(LAYERS)], rtol=1e-12)
    for row, setting in zip(out["table"]["rows"], ("with", "without")):
        assert row[:2] == ["a", setting]
        assert_cells(row[2:], [table.value("bos_sink_rate", bos=setting),
                               table.value("bos_sink_rate_from_layer", bos=setting, layer_start=2)])
    out, keep = entry([run], "bos_repeat_loss_delta")
    for line, setting in zip(keep.lines(0), ("with", "without")):
        np.testing.assert_array_equal(line.get_xdata(), [1, 2, 4])
        np.testing.assert_allclose(line.get_ydata(), [table.value("bos_repeat_loss_delta", bos=setting, repeat=r)
                                                      for r in (1, 2, 4)], rtol=1e-12, atol=1e-15)
    body = out["table"]["rows"]
    assert [(row[1], row[2]) for row in body] == [(s, str(r)) for s in ("with", "without") for r in (1, 2, 4)]
    for row in body:
        setting, r = row[1], int(row[2])
        assert_cells(row[3:], [table.value("bos_repeat_loss", bos=setting, repeat=r),
                               table.value("bos_repeat_loss_delta", bos=setting, repeat=r)])


@pytest.mark.filterwarnings("ignore:No artists with labels found")
def test_a_run_without_the_bos_experiment_adds_no_rows(tmp_path, one):
    table, run = one
    plain = make_run(tmp_path / "plain", circuit_rows(3, bos=False), "plain")
    for metric in ("bos_sink_rate", "bos_repeat_loss_delta"):
        alone, _ = entry([plain], metric)
        assert alone["table"]["rows"] == []
        both, _ = entry([run, plain], metric)
        assert {row[0] for row in both["table"]["rows"]} == {"a"}
        assert circuit.summary_value(plain.table, metric) is None


def test_two_runs_are_one_comparison_with_labelled_columns_and_lines(tmp_path):
    tables = [circuit_rows(4), circuit_rows(5)]
    runs = [make_run(tmp_path / name, t, name) for name, t in zip(("base", "gated"), tables)]
    out, keep = entry(runs, "p0_norm")
    assert out["table"]["columns"] == ["layer", "p0 norm (base)", "median other (base)", "ratio (base)",
                                       "p0 norm (gated)", "median other (gated)", "ratio (gated)"]
    for row, layer in zip(out["table"]["rows"], range(LAYERS)):
        assert_cells(row[1:], [t.value(m, layer) for t in tables for m in ("p0_norm", "other_norm", "p0_norm_ratio")])
    labels = [line.get_label() for line in keep.lines(0)]
    assert labels == [f"{run}: {line}" for run in ("base", "gated") for line in ("position 0", "median of the others")]
    out, keep = entry(runs, "attn_z_norm")
    assert len(keep.lines(0)) == 5  # two runs: no per-head lines; each run a curve and a dot, and the dashed 1
    assert [row[:2] for row in out["table"]["rows"]] == [[r, h] for r in ("base", "gated")
                                                         for h in ("pooled", "0", "1")]
