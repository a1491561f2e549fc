"""``report/steps.py``: metrics against the training step, from a series of runs and from a monitor.csv.

Runs are ``RunData`` built by hand (manifest conditions ``step`` / ``revision`` / ``variant``, tables
from ``rows_to_frame`` with those run conditions); monitors are ``monitor.csv`` / ``monitor.json``
files written into ``tmp_path`` with the monitor's columns. The reference is the rows put in: each
figure line must carry exactly the per-layer (no head, no probe condition) or model values of its
metric at the right x, each table cell the same number (``page.fmt``: 6 significant digits), p0
mass the uniform floor computed here as the mean over i = 1 .. T-1 of 1/(i+1), and anything that is
not a series, or has nothing to draw, must give None or no figure.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from sinkscope.errors import SinkscopeError
from sinkscope.report import steps
from sinkscope.report.curves import MODEL_LINE
from sinkscope.report.runs import RunData
from sinkscope.store.results import Row, rows_to_frame

LAYERS, HEADS, SEQ_LEN = 2, 2, 16
CELL = 5e-6  # a table cell shows 6 significant digits
DOC = {"label": "P0 mass", "unit": "share", "formula": "w_i0", "source": "SPEC.md", "direction": "",
       "per": "layer x head"}


def uniform_floor(seq_len: int) -> float:
    return float(np.mean([1.0 / (i + 1) for i in range(1, seq_len)]))


def metric_rows(metric: str, per_layer: np.ndarray, *, extra: bool = True) -> list[Row]:
    """Per-head rows, per-layer means, the model mean and (``extra``) rows the curves must ignore."""
    rows = []
    for layer, value in enumerate(per_layer):
        rows += [Row(metric, metric, layer, h, value * (1 + 0.1 * (h - 0.5)), 8) for h in range(HEADS)]
        rows.append(Row(metric, metric, layer, None, value, 16))
    rows.append(Row(metric, metric, None, None, float(per_layer.mean()), 32))
    if extra:  # a layer-type mean and a row under a probe condition: not a per-layer or model value
        rows += [Row(metric, metric, None, None, 9.0, 16, (("layer_type", "sliding"),)),
                 Row(metric, metric, 0, None, 7.0, 16, (("dose", 0.5),))]
    return rows


def make_run(tmp_path: Path, label: str, values: dict[str, np.ndarray], conditions: dict) -> RunData:
    rows = [row for metric, per_layer in values.items() for row in metric_rows(metric, per_layer)]
    table = rows_to_frame(rows, conditions)
    manifest = {"conditions": conditions, "windows": {"seq_len": SEQ_LEN},
                "probes": {"p0_mass": {"metrics": {"p0_mass": DOC}}}}
    return RunData(tmp_path / label, label, manifest, table)


class Keeper:
    """``keep(fig, stem, title)`` that remembers the figures instead of saving them."""

    def __init__(self):
        self.kept: list[tuple] = []

    def __call__(self, fig, stem: str, title: str) -> dict:
        self.kept.append((fig, stem, title))
        return {"stem": stem}

    def lines(self, index: int) -> dict:
        return {str(line.get_label()): line for line in self.kept[index][0].axes[0].lines}


def series(tmp_path: Path, conditions: list[dict], seed: int = 0):
    rng = np.random.default_rng(seed)
    values = [{"p0_mass": rng.uniform(0.1, 0.9, LAYERS), "value_norm_ratio": rng.uniform(0.5, 2.0, LAYERS)}
              for _ in conditions]
    runs = [make_run(tmp_path, f"r{i}", v, c) for i, (v, c) in enumerate(zip(values, conditions))]
    return runs, values


# ---- rows and curves -----------------------------------------------------------------------------------


def test_plain_rows_keep_layer_and_model_rows_without_heads_or_probe_conditions():
    per_layer = np.array([0.3, 0.6])
    table = rows_to_frame(metric_rows("p0_mass", per_layer) + metric_rows("sink_rate", per_layer + 1),
                          {"step": 100, "revision": "step100"})
    rows = steps.plain_rows(table, "p0_mass")
    assert rows["layer"].tolist()[:LAYERS] == list(range(LAYERS)) and rows["layer"].isna().sum() == 1
    np.testing.assert_allclose(rows["value"], [*per_layer, per_layer.mean()])
    assert (rows["step"] == 100).all() and (rows["revision"] == "step100").all()  # run conditions are kept
    assert len(steps.plain_rows(table, "absent")) == 0


def test_curves_are_one_line_per_layer_and_the_model_value_at_each_step():
    rng = np.random.default_rng(1)
    frames, by_step = [], {}
    for step in (0, 50, 200):
        by_step[step] = rng.uniform(0, 1, LAYERS)
        frames.append(rows_to_frame(metric_rows("p0_mass", by_step[step]), {"step": step}))
    lines = steps.curves(pd.concat(frames, ignore_index=True), "p0_mass")
    assert list(lines) == [*[f"layer {l}" for l in range(LAYERS)], MODEL_LINE]
    for layer in range(LAYERS):
        assert lines[f"layer {layer}"]["step"].tolist() == [0, 50, 200]
        np.testing.assert_allclose(lines[f"layer {layer}"]["value"], [by_step[s][layer] for s in (0, 50, 200)])
    np.testing.assert_allclose(lines[MODEL_LINE]["value"], [by_step[s].mean() for s in (0, 50, 200)])
    x = pd.Series(7.0, index=pd.concat(frames, ignore_index=True).index)  # every row placed at x = 7
    assert set(steps.curves(pd.concat(frames, ignore_index=True), "p0_mass", x=x)["layer 0"]["step"]) == {7.0}


# ---- which runs are a series ---------------------------------------------------------------------------


def _runs(tmp_path, conditions: list[dict]) -> list[RunData]:
    return [RunData(tmp_path / f"r{i}", f"r{i}", {"conditions": c}, pd.DataFrame()) for i, c in enumerate(conditions)]


@pytest.mark.parametrize("conditions, want", [
    ([{"step": 0, "revision": "step0"}, {"step": 1000, "revision": "step1000"}], ([0.0, 1000.0], None)),
    ([{"step": 5, "variant": "base", "seed": 0}, {"step": 10, "variant": "base", "seed": 0}], ([5.0, 10.0], None)),
    ([{"revision": "main"}, {"revision": "dev"}], ([0.0, 1.0], {0.0: "main", 1.0: "dev"})),
    ([{"step": 0, "revision": "step0"}, {"revision": "main"}], ([0.0, 1.0], {0.0: "step0", 1.0: "main"})),
    ([{"step": 0, "revision": "a"}], None),  # one run is not a series
    ([{"step": 0}, {"variant": "x"}], None),  # a run without a step or revision
    ([{"step": 0, "revision": "a"}, {"step": 0, "revision": "a"}], None),  # the same checkpoint twice
    ([{"step": 5, "variant": "base"}, {"step": 10, "variant": "gated"}], None),  # two trainings compared
])
def test_series_positions(tmp_path, conditions, want):
    assert steps.series_positions(_runs(tmp_path, conditions)) == want


# ---- the series section --------------------------------------------------------------------------------


def test_series_section_draws_and_tabulates_every_metric_against_the_step(tmp_path):
    conditions = [{"step": s, "revision": f"step{s}"} for s in (0, 10, 30)]
    runs, values = series(tmp_path, conditions)
    keep = Keeper()
    section = steps.series_section(runs, ["p0_mass", "value_norm_ratio", "absent"], tmp_path / "figs", keep)
    assert section["probe"] == "steps" and section["note"] == steps.STEPS_NOTE
    assert [e["metric"] for e in section["entries"]] == ["p0_mass_vs_step", "value_norm_ratio_vs_step"]
    assert [stem for _, stem, _ in keep.kept] == ["steps_p0_mass", "steps_value_norm_ratio"]
    assert section["entries"][0]["info"].label == "P0 mass against the step"  # the manifest's documentation
    for index, metric in enumerate(("p0_mass", "value_norm_ratio")):
        lines = keep.lines(index)
        for layer in range(LAYERS):
            np.testing.assert_array_equal(lines[f"layer {layer}"].get_xdata(), [0, 10, 30])
            np.testing.assert_allclose(lines[f"layer {layer}"].get_ydata(), [v[metric][layer] for v in values])
        np.testing.assert_allclose(lines[MODEL_LINE].get_ydata(), [v[metric].mean() for v in values])
        floors = [line for label, line in lines.items() if label.startswith("uniform attention")]
        if metric == "p0_mass":
            assert len(floors) == 1
            np.testing.assert_allclose(floors[0].get_ydata(), uniform_floor(SEQ_LEN))
        else:
            assert not floors
        table = section["entries"][index]["table"]
        assert table["columns"] == ["step", *[f"layer {l}" for l in range(LAYERS)], MODEL_LINE]
        assert [row[0] for row in table["rows"]] == ["0", "10", "30"]
        for row, v in zip(table["rows"], values):
            np.testing.assert_allclose([float(c) for c in row[1:]], [*v[metric], v[metric].mean()], rtol=CELL)


def test_a_series_without_steps_is_placed_by_revision_with_their_names(tmp_path):
    runs, values = series(tmp_path, [{"revision": "main"}, {"revision": "v2"}, {"revision": "v3"}], seed=2)
    keep = Keeper()
    section = steps.series_section(runs, ["value_norm_ratio"], tmp_path, keep)
    table = section["entries"][0]["table"]
    assert table["columns"][0] == "revision" and [row[0] for row in table["rows"]] == ["main", "v2", "v3"]
    axis = keep.kept[0][0].axes[0]
    assert [t.get_text() for t in axis.get_xticklabels()] == ["main", "v2", "v3"] and axis.get_xlabel() == "revision"
    np.testing.assert_array_equal(keep.lines(0)["layer 0"].get_xdata(), [0, 1, 2])
    np.testing.assert_allclose(keep.lines(0)["layer 1"].get_ydata(), [v["value_norm_ratio"][1] for v in values])


def test_no_series_or_nothing_to_draw_gives_no_section(tmp_path):
    runs, _ = series(tmp_path, [{"step": 5, "variant": "a"}, {"step": 5, "variant": "b"}])
    keep = Keeper()
    assert steps.series_section(runs, ["p0_mass"], tmp_path, keep) is None  # not one model's steps
    runs, _ = series(tmp_path, [{"step": 1}, {"step": 2}])
    assert steps.series_section(runs, ["absent"], tmp_path, keep) is None
    assert steps.series_section(runs[:1], ["p0_mass"], tmp_path, keep) is None
    assert keep.kept == []


# ---- a checkpoint's monitor ----------------------------------------------------------------------------


def write_monitor(folder: Path, per_step: dict[int, dict[str, np.ndarray]], windows=(4, SEQ_LEN)) -> Path:
    """monitor.csv (the monitor's columns; empty cells for missing layer/head) and monitor.json."""
    folder.mkdir(parents=True, exist_ok=True)
    records = []
    for step, metrics in per_step.items():
        for metric, per_layer in metrics.items():
            for row in metric_rows(metric, per_layer, extra=False):
                records.append({"step": step, "probe": row.probe, "metric": row.metric, "layer": row.layer,
                                "head": row.head, "value": row.value, "n": row.n})
    pd.DataFrame(records).astype({"layer": "Int64", "head": "Int64"}).to_csv(folder / steps.MONITOR_TABLE, index=False)
    if windows is not None:
        (folder / steps.MONITOR_MANIFEST).write_text(json.dumps({"windows": list(windows)}))
    return folder


def monitor_values(seed: int, steps_: tuple[int, ...] = (0, 5, 10), phantom: float = 0.0) -> dict:
    rng = np.random.default_rng(seed)
    return {s: {"p0_mass": rng.uniform(0.1, 0.9, LAYERS), "phantom_mass": np.full(LAYERS, phantom),
                "value_norm_ratio": rng.uniform(0.5, 2.0, LAYERS), "sink_rate": rng.uniform(0, 1, LAYERS)}
            for s in steps_}


def test_read_monitor_gives_the_table_and_the_windows_length(tmp_path):
    values = monitor_values(0)
    folder = write_monitor(tmp_path / "ckpt", values)
    table, seq_len = steps.read_monitor(folder)
    assert seq_len == SEQ_LEN
    assert str(table["layer"].dtype) == "Int64" and str(table["head"].dtype) == "Int64"
    rows = table[(table.metric == "p0_mass") & (table.step == 5) & table["head"].isna() & table["layer"].notna()]
    np.testing.assert_allclose(rows.sort_values("layer")["value"], values[5]["p0_mass"])
    assert steps.read_monitor(tmp_path / "nothing") is None
    (folder / steps.MONITOR_MANIFEST).write_text("{not json")
    assert steps.read_monitor(folder)[1] is None  # an unreadable manifest: the length is unknown, not an error


@pytest.mark.parametrize("text", ["", "step,metric,layer,value\n0,p0_mass,0,0.5\n"])
def test_a_broken_monitor_table_is_one_sentence(tmp_path, text):
    (tmp_path / steps.MONITOR_TABLE).write_text(text)
    with pytest.raises(SinkscopeError) as error:
        steps.read_monitor(tmp_path)
    message = str(error.value)
    assert "\n" not in message and message.endswith(".") and steps.MONITOR_TABLE in message


def test_formation_figures_of_one_checkpoint_are_per_layer(tmp_path):
    values = monitor_values(1)
    monitors = {"ckpt": steps.read_monitor(write_monitor(tmp_path / "ckpt", values))}
    keep = Keeper()
    drawn = steps.formation_figures(monitors, keep)
    # the monitor's metrics in their order (phantom mass is zero: no phantom key, no figure), then the rest
    assert [stem for _, stem, _ in keep.kept] == ["formation_p0_mass", "formation_value_norm_ratio",
                                                  "formation_sink_rate"]
    assert drawn == [{"stem": stem} for _, stem, _ in keep.kept]
    for index, metric in enumerate(("p0_mass", "value_norm_ratio", "sink_rate")):
        lines = keep.lines(index)
        for layer in range(LAYERS):
            np.testing.assert_array_equal(lines[f"layer {layer}"].get_xdata(), [0, 5, 10])
            np.testing.assert_allclose(lines[f"layer {layer}"].get_ydata(),
                                       [values[s][metric][layer] for s in (0, 5, 10)])
        np.testing.assert_allclose(lines[MODEL_LINE].get_ydata(), [values[s][metric].mean() for s in (0, 5, 10)])
    floors = [line for label, line in keep.lines(0).items() if label.startswith("uniform attention")]
    np.testing.assert_allclose(floors[0].get_ydata(), uniform_floor(SEQ_LEN))


def test_formation_figures_of_several_checkpoints_overlay_their_model_values(tmp_path):
    values = {"base": monitor_values(2, phantom=0.2), "gated": monitor_values(3, steps_=(0, 10))}
    monitors = {name: steps.read_monitor(write_monitor(tmp_path / name, v)) for name, v in values.items()}
    keep = Keeper()
    steps.formation_figures(monitors, keep)
    stems = [stem for _, stem, _ in keep.kept]
    assert stems == ["formation_p0_mass", "formation_phantom_mass", "formation_value_norm_ratio",
                     "formation_sink_rate"]  # one checkpoint has a phantom key: its curve is drawn
    for index, metric in enumerate(("p0_mass", "phantom_mass", "value_norm_ratio", "sink_rate")):
        lines = keep.lines(index)
        for name, per_step in values.items():
            np.testing.assert_array_equal(lines[name].get_xdata(), sorted(per_step))
            np.testing.assert_allclose(lines[name].get_ydata(), [per_step[s][metric].mean() for s in sorted(per_step)])
        assert not [label for label in lines if label.startswith("layer ")]
    assert any(label.startswith("uniform attention") for label in keep.lines(0))
    # windows of two lengths: no single uniform floor to draw
    write_monitor(tmp_path / "gated", values["gated"], windows=(4, 2 * SEQ_LEN))
    monitors["gated"] = steps.read_monitor(tmp_path / "gated")
    keep = Keeper()
    steps.formation_figures(monitors, keep)
    assert not any(label.startswith("uniform attention") for label in keep.lines(0))
    assert math.isclose(monitors["gated"][1], 2 * SEQ_LEN)
