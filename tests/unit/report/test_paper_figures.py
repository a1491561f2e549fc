"""Paper-ready figures and tables (issue 61, item 9): what a reader of a page gets.

- A figure's title is the metric's label, never ``Label [metric_id]``: every figure the golden runs'
  pages draw (one run each, and a comparison) is read back for its titles.
- A metric whose value is an index (``massive_activation_channel``) is drawn as categories: markers on
  a categorical axis labelled with the channels, no line through them, no colour scale of indices.
- ``value ± se`` reads rounded where the se's second significant digit ends in the page's tables.
- A comparison keeps one colour per run on every figure of the page, whichever runs a figure leaves
  out, with a legend on each; a figure of several panels keeps one colour per line over its panels.
- The comparison's warnings leave out the difference that is the comparison's own condition (Gu et
  al.'s inputs: one model on text, random and repeated tokens) and keep the accidental ones.

The references are the runs' own tables and manifests (tests/golden) and hand-built rows.
"""

from __future__ import annotations

import re
import shutil
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from matplotlib.colors import to_hex

from sinkscope.probes import metric_info
from sinkscope.report import build_report, circuit, figures, generic, inject, stream
from sinkscope.report.page import Page, _differences
from sinkscope.report.runs import RunData, read_run
from sinkscope.store.results import MetricInfo, Row, rows_to_frame
from repo_paths import GOLDEN

LABELS = figures.MetricLabels.from_docs(metric_info())


class Keeper:
    """``keep(fig, stem, title)`` that remembers the figures instead of saving them."""

    def __init__(self):
        self.kept: dict[str, object] = {}

    def __call__(self, fig, stem: str, title: str) -> dict:
        self.kept[stem] = fig
        return {"stem": stem, "title": title}


def page_of(runs: list[RunData], fig_dir: Path, docs=None) -> Page:
    return Page(runs, fig_dir, dict(docs if docs is not None else
                                    {m: i for m, i in metric_info().items()}), keep=Keeper())


def run_of(rows: list[Row], label: str, manifest: dict | None = None) -> RunData:
    return RunData(Path(label), label, manifest or {}, rows_to_frame(rows))


@pytest.fixture
def drawn(monkeypatch):
    """Every figure a page build saves, by file stem (a 1-pixel file is written instead of the drawing)."""
    figs: dict[str, object] = {}

    def save(fig, stem):
        stem = Path(stem)
        stem.parent.mkdir(parents=True, exist_ok=True)
        figs[stem.name] = fig
        paths = [stem.with_name(stem.name + ".png"), stem.with_name(stem.name + ".svg")]
        for path in paths:
            path.write_bytes(b"")
        return paths

    monkeypatch.setattr(figures, "save_figure", save)
    return figs


def titles(fig) -> list[str]:
    suptitle = fig._suptitle.get_text() if fig._suptitle is not None else ""
    return [t for t in [suptitle, *(ax.get_title() for ax in fig.axes)] if t]


# ---- titles ------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("runs", [["run_sinks_smollm2"], ["run_selectivity_normgate"], ["run_inject_llama"],
                                  ["run_circuit_llama"], ["run_heads_llama"], ["run_stream_llama"],
                                  ["run_sinks_smollm2", "run_tiny_gpt_oss"]])
def test_no_figure_title_names_a_metric_id(runs, drawn, tmp_path):
    folders = []
    for name in runs:
        shutil.copytree(GOLDEN / name, tmp_path / name)
        folders.append(tmp_path / name)
    build_report(folders, out=tmp_path / "page")
    metrics = set().union(*[set(read_run(f).table.metric.astype(str)) for f in folders])
    assert drawn
    for stem, fig in drawn.items():
        for title in titles(fig):
            assert not re.search(r"\[[A-Za-z0-9_]+\]", title), (stem, title)
            named = [m for m in metrics if "_" in m and re.search(rf"\b{re.escape(m)}\b", title)]
            assert not named, (stem, title)
    label = LABELS.names["p0_mass"][0]
    if "run_sinks_smollm2" in runs:
        stem = "layers_p0_mass" if len(runs) == 1 else "overlay_p0_mass"
        assert titles(drawn[stem]) == [label]


def test_the_title_is_the_label_and_the_unit_stays_on_the_axis():
    tidy = read_run(GOLDEN / "run_sinks_smollm2").table
    label, unit = LABELS.names["p0_mass"]
    line = figures.per_layer_line(tidy, "p0_mass", labels=LABELS)
    assert line.axes[0].get_title() == label and line.axes[0].get_ylabel() == f"{label} ({unit})"
    assert figures.layer_head_heatmap(tidy, "p0_mass", labels=LABELS).axes[0].get_title() == label
    assert figures.metric_title("not_documented", LABELS) == "not_documented"  # no label known: the name


# ---- categories --------------------------------------------------------------------------------------------


def channel_rows(channels: list[int], metric: str = "massive_activation_channel") -> list[Row]:
    rows = [Row("massive_activation", metric, layer, None, float(c), 8) for layer, c in enumerate(channels)]
    return rows + [Row("massive_activation", metric, None, None, float(channels[-1]), 8)]


def test_an_index_unit_makes_a_metric_categorical():
    assert figures.is_index_unit("channel index") and figures.is_index_unit("token position")
    assert figures.is_index_unit("layer index")
    assert not figures.is_index_unit("share of real-key mass") and not figures.is_index_unit("ratio")
    assert {"massive_activation_channel", "massive_activation_position"} <= LABELS.categorical
    assert "massive_activation" not in LABELS.categorical and "p0_mass" not in LABELS.categorical


def test_channels_are_drawn_as_categories_not_a_line(tmp_path):
    channels = [507, 507, 12, 3071, 507]
    page = page_of([run_of(channel_rows(channels), "a")], tmp_path)
    out = generic.entry(page, "massive_activation_channel")
    assert [f["files"][0] for f in out["figures"]] == ["layers_massive_activation_channel.png"]  # no heatmap
    fig = figures.per_layer_categories({"a": page.runs[0].table}, "massive_activation_channel", labels=LABELS)
    ax = fig.axes[0]
    assert not ax.lines  # nothing joins the channels
    assert [t.get_text() for t in ax.get_yticklabels()] == ["12", "507", "3071"]  # categories, in order
    rows = {507: 1, 12: 0, 3071: 2}
    np.testing.assert_allclose(ax.collections[0].get_offsets(), [[layer, rows[c]] for layer, c in enumerate(channels)])
    assert ax.get_title() == LABELS.names["massive_activation_channel"][0] and ax.get_ylabel() == "channel index"


def test_a_single_runs_figures_draw_an_index_metric_as_categories(tmp_path):
    table = rows_to_frame(channel_rows([5, 9, 5]))
    figures.write_run_figures(table, tmp_path, labels=LABELS)
    assert (tmp_path / "figures" / "layers_massive_activation_channel.png").is_file()
    two = figures.per_layer_categories({"a": table, "b": rows_to_frame(channel_rows([9, 9, 1]))},
                                       "massive_activation_channel", labels=LABELS)
    ax = two.axes[0]
    assert [t.get_text() for t in ax.get_yticklabels()] == ["1", "5", "9"]
    assert len(ax.collections) == 2 and ax.get_legend() is not None
    first, second = (c.get_offsets()[:, 0] for c in ax.collections)
    assert (first < np.arange(3)).all() and (second > np.arange(3)).all()  # side by side within a layer


# ---- value ± se in the page's tables -----------------------------------------------------------------------


def test_a_layer_table_rounds_the_value_to_its_standard_error(tmp_path):
    rows = [Row("p0_mass", "p0_mass", 0, None, 0.0348732, 8, se=2.02109e-05),
            Row("p0_mass", "p0_mass", 1, None, 0.5, 8),
            Row("p0_mass", "p0_mass", None, None, 0.3, 8)]
    page = page_of([run_of(rows, "a")], tmp_path)
    table = generic.entry(page, "p0_mass")["table"]
    assert [r[1] for r in table["rows"]] == ["0.034873 ± 0.000020", "0.5"]


# ---- one colour per run ------------------------------------------------------------------------------------


def layer_rows(metric: str, values: list[float]) -> list[Row]:
    rows = []
    for layer, value in enumerate(values):
        rows += [Row(metric, metric, layer, h, value + 0.01 * h, 4) for h in range(2)]
        rows.append(Row(metric, metric, layer, None, value, 8))
    return rows + [Row(metric, metric, None, None, float(np.mean(values)), 16)]


def gpt_oss_like(label: str, phantom: bool, shift: float) -> RunData:
    rows = layer_rows("p0_mass", [0.2 + shift, 0.6]) + layer_rows("phantom_mass", [0.1 + shift, 0.3] if phantom
                                                                   else [0.0, 0.0])
    rows += layer_rows("token_share", [0.3 + shift, 0.4])
    return run_of(rows, label, {"model": {"spec": {"has_phantom": phantom}}})


def line_colours(fig) -> dict[str, str]:
    ax = fig.axes[0]
    return {line.get_label(): to_hex(line.get_color()) for line in ax.lines if not line.get_label().startswith("_")}


def test_a_run_keeps_its_colour_in_every_figure_of_a_comparison(drawn, tmp_path):
    runs = [gpt_oss_like("llama", False, 0.0), gpt_oss_like("oss-a", True, 0.05), gpt_oss_like("oss-b", True, 0.1)]
    page = page_of(runs, tmp_path)
    assert list(page.colours) == ["llama", "oss-a", "oss-b"] and len(set(page.colours.values())) == 3
    for metric in ("p0_mass", "phantom_mass", "token_share"):
        generic.entry(page, metric)
    p0, phantom = line_colours(drawn["overlay_p0_mass"]), line_colours(drawn["overlay_phantom_mass"])
    assert p0 == page.colours
    assert phantom == {"oss-a": page.colours["oss-a"], "oss-b": page.colours["oss-b"]}  # llama left out, no shift
    bars = drawn["bars_token_share"].axes[0]
    assert [to_hex(c.patches[0].get_facecolor()) for c in bars.containers] == list(page.colours.values())
    for stem in ("overlay_p0_mass", "overlay_phantom_mass", "bars_token_share"):
        assert drawn[stem].axes[0].get_legend() is not None, stem


def test_the_runs_colours_are_the_pages_order_and_stay_apart():
    colours = figures.run_colours(["b", "a", "b", "c"])
    assert list(colours) == ["b", "a", "c"] and len(set(colours.values())) == 3
    assert figures.run_colours(["b", "a", "c"]) == colours  # the same runs, the same colours
    many = figures.run_colours([f"run {k}" for k in range(14)])
    assert len(set(many.values())) == 14  # tab20 past ten runs


def test_the_dose_response_and_the_circuit_draw_a_run_in_its_page_colour():
    colours = {"a": "#123456", "b": "#abcdef"}
    points = pd.DataFrame({"run": ["b", "b", "a", "a"], "cutoff": ["median"] * 4, "dose": [0.5, 2.0] * 2,
                           "value": [0.1, 0.4, 0.2, 0.5], "se": [np.nan] * 4})
    from sinkscope.report import curves

    assert line_colours(curves.dose_response(points, "gaussian", colours)) == {"b: median": "#abcdef",
                                                                               "a: median": "#123456"}
    rows = [Row("bos_experiment", "bos_sink_rate", layer, None, 0.5, 4, conditions=(("bos", bos),))
            for layer in (0, 1) for bos in ("with", "without")]
    runs = [run_of(rows, "a"), run_of(rows, "b")]
    keep = Keeper()
    circuit.draw(runs, "bos_sink_rate", keep, colours)
    fig = keep.kept["circuit_bos_sink_rate"]
    assert line_colours(fig) == {"a: with BOS": "#123456", "a: without BOS": "#123456",
                                 "b: with BOS": "#abcdef", "b: without BOS": "#abcdef"}  # a run is one colour
    assert fig.axes[0].get_legend() is not None


def test_a_figure_of_several_panels_keeps_a_colour_per_line_and_a_legend_on_each():
    def bucket_rows(policy, sinks, cache, value):
        return [{"policy": policy, "sink_tokens": sinks, "cache": cache, "position_bucket": b, "value": value + b / 100}
                for b in (0, 16, 32)]

    rows = pd.DataFrame(bucket_rows("full", 0, np.nan, 3.0) + bucket_rows("window", 0, 8, 4.0)
                        + bucket_rows("sinks", 4, 8, 3.5) + bucket_rows("sinks", 4, 16, 3.2))  # no window at 16
    fig = stream.log_ppl_by_position(rows, "log perplexity")
    panels = [ax for ax in fig.axes if ax.get_title().startswith("cache")]
    assert len(panels) == 2
    sinks = {to_hex(line.get_color()) for ax in panels for line in ax.lines if line.get_label().startswith("sinks")}
    assert len(sinks) == 1  # the same colour in both panels, though the second has no window line
    assert all(ax.get_legend() is not None for ax in panels)


# ---- the comparison's warnings -----------------------------------------------------------------------------


def manifest(model: str, inputs: str = "text", corpus: str = "austen", bos: str = "auto", bos_id=None,
             text_file=None) -> dict:
    return {"model": {"source": {"kind": "hub", "location": model, "revision": None, "label": model}},
            "options": {"inputs": inputs, "bos": bos, "seq_len": 64, "text_file": text_file},
            "corpus": {"name": corpus, "sha256": corpus * 4},
            "windows": {"seq_len": 64, "bos_policy": bos, "bos_id": bos_id, "tokenizer_bos_id": 1}}


def bare(label: str, manifest_: dict) -> RunData:
    return RunData(Path(label), label, manifest_, pd.DataFrame())


def test_gu_inputs_differ_in_corpus_by_design_and_get_no_warning():
    """recipes/gu-inputs.toml: one model on natural text, random tokens and a repeated token."""
    runs = [bare("natural text", manifest("smollm2", "text", "austen")),
            bare("random tokens", manifest("smollm2", "random", "random")),
            bare("repeated token", manifest("smollm2", "repeated", "repeated"))]
    assert _differences(runs) == []


def test_a_bos_experiment_differs_in_bos_by_design():
    runs = [bare("without", manifest("smollm2", bos="none")), bare("with", manifest("smollm2", bos="add", bos_id=1))]
    assert _differences(runs) == []


def test_a_grouped_or_conditioned_field_is_the_comparisons_own():
    a, b = manifest("smollm2", corpus="austen"), manifest("smollm2", corpus="wiki")
    a["conditions"], b["conditions"] = {"corpus": "austen"}, {"corpus": "wiki"}
    assert _differences([bare("a", a), bare("b", b)]) == []
    c, d = manifest("m1", corpus="austen"), manifest("m2", corpus="wiki")
    c["grouped"] = d["grouped"] = {"by": "corpus"}
    assert _differences([bare("c", c), bare("d", d)]) == []


def test_accidental_differences_are_still_warned_about():
    # two models on different text files: the corpus is one more difference between them
    runs = [bare("m1", manifest("m1", corpus="austen", text_file="a.txt")),
            bare("m2", manifest("m2", corpus="wiki", text_file="b.txt"))]
    assert [w.split(" (")[0] for w in _differences(runs)] == ["The runs differ in corpus"]
    # one model, the same options, but the corpus changed between the runs
    same = [bare("before", manifest("m1", corpus="austen")), bare("after", manifest("m1", corpus="austen2"))]
    assert "differ in corpus" in " ".join(_differences(same))
    # --bos auto on two tokenizers: BOS added for one only
    auto = [bare("m1", manifest("m1", bos="auto", bos_id=1)), bare("m2", manifest("m2", bos="auto"))]
    assert "differ in BOS policy" in " ".join(_differences(auto))
    # Gu's inputs on two models: the models differ too, so the corpus is warned about
    gu = [bare("m1", manifest("m1", "text", "austen")), bare("m2", manifest("m2", "random", "random"))]
    assert "differ in corpus" in " ".join(_differences(gu))
