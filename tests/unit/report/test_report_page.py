"""``report/page.py``: how numbers print, how a figure is kept, the per-page context every section draws with.

The reference for the numbers is the format written down here (6 significant digits, an em dash
for NaN; ``value ± se`` rounded to the se's two significant digits, signed for a difference), for the documentation the
runs' manifests (one metric's first recording wins), for a kept figure the files on disk and the
PNG embedded byte for byte.
"""

from __future__ import annotations

import base64
import math
from pathlib import Path

import pandas as pd
from matplotlib.figure import Figure

from sinkscope.report import figures
from sinkscope.report.page import (COLLAPSE_ROWS, Page, _differences, _embed_png, _keeper, _metric_docs, _pm, _run_info,
                                   bos_summary, fmt, fmt_se, trained_context_summary)
from sinkscope.report.runs import RunData

DOC = {"label": "Value-norm ratio", "unit": "ratio", "formula": "f", "source": "s", "direction": "", "per":
       "layer x KV head"}


def run(label: str, manifest: dict) -> RunData:
    return RunData(Path(label), label, manifest, pd.DataFrame())


def test_numbers_print_with_six_digits_and_a_dash_for_nothing():
    assert fmt(1 / 3) == "0.333333" and fmt(12345678) == "1.23457e+07" and fmt(2) == "2"
    assert fmt(None) == fmt(math.nan) == fmt(pd.NA) == "—"
    assert fmt_se(0.5, 0.01) == "0.500 ± 0.010" and fmt_se(0.5, math.nan) == fmt_se(0.5, None) == "0.5"
    # the newcomer's cell (issue 61): the value rounded where the se's second significant digit ends
    assert fmt_se(0.0348732, 2.02109e-05) == "0.034873 ± 0.000020" and fmt_se(math.nan, 0.1) == "—"
    assert _pm(3.18234, 0.2149) == "+3.18 ± 0.21" and _pm(-0.5, math.nan) == "-0.5"
    assert COLLAPSE_ROWS == 16


def test_metric_docs_come_from_the_manifests_first_recording_first():
    a = run("a", {"probes": {"v": {"metrics": {"value_norm_ratio": DOC, "broken": "not a dict"}}}})
    b = run("b", {"probes": {"v": {"metrics": {"value_norm_ratio": {**DOC, "label": "later"}}}}})
    docs = _metric_docs([a, b])
    assert list(docs) == ["value_norm_ratio"] and docs["value_norm_ratio"].label == "Value-norm ratio"
    page = Page.of([a, b], Path("unused"))
    assert page.docs == docs and page.info("value_norm_ratio") == docs["value_norm_ratio"]
    assert page.info("absent").label == "absent" and page.info("absent").unit == ""
    # the figures' labels are this page's own (no module-level registry)
    assert page.labels.names == {"value_norm_ratio": ("Value-norm ratio", "ratio")}
    assert page.labels.kv_heads == frozenset({"value_norm_ratio"})
    assert Page([a], Path("unused")).labels.names == {}


def test_sections_add_summary_rows_in_order():
    page = Page([], Path("unused"), keep=lambda fig, stem, title: {"stem": stem})
    page.add_summary("m1", "first", "higher = more", ["1"])
    page.add_summary("m2", "second", "", ["2"])
    assert page.summary == [{"metric": "m1", "label": "first", "direction": "higher = more", "values": ["1"]},
                            {"metric": "m2", "label": "second", "direction": "", "values": ["2"]}]
    assert page.keep(None, "s", "t") == {"stem": "s"}


def test_a_kept_figure_is_saved_beside_the_page_and_embedded(tmp_path):
    fig = Figure(figsize=(1, 1))
    fig.add_subplot().plot([0, 1], [0, 1])
    kept = _keeper(tmp_path)(fig, "line_x", "a line")
    assert kept["title"] == "a line" and kept["kind"] == "line" and kept["files"] == ["line_x.png", "line_x.svg"]
    png = tmp_path / "line_x.png"
    assert (tmp_path / "line_x.svg").is_file()
    assert kept["src"] == _embed_png(png) == "data:image/png;base64," + base64.b64encode(png.read_bytes()).decode()
    assert Page([], tmp_path).keep(fig, "again", "t")["files"] == ["again.png", "again.svg"]  # the default keeper
    assert figures.save_figure  # what the keeper calls (tests patch it there)


def test_what_was_run_and_where_runs_differ():
    windows = {"bos_policy": "auto", "bos_id": None, "tokenizer_bos_id": 1, "seq_len": 32}
    a = run("a", {"windows": windows, "model": {"source": {"label": "llama"}}, "conditions": {"step": 5}})
    b = run("b", {"windows": {**windows, "seq_len": 64}})
    assert bos_summary(windows) == "auto: no BOS prepended (the tokenizer's BOS, id 1, is not added by default)"
    assert bos_summary({}) == "—: no BOS prepended"
    info = _run_info([a, b])
    assert info["columns"] == ["", "a", "b"]
    rows = {row[0]: row[1:] for row in info["rows"]}
    assert rows["model"] == ["llama", "—"] and rows["seq-len"] == ["32", "64"]
    assert rows["conditions"] == ["step=5", "—"]
    warnings = _differences([a, b])
    assert len(warnings) == 1 and "differ in seq-len (a: 32; b: 64)" in warnings[0]
    assert _differences([a, b], skip=("seq-len",)) == []


def test_the_trained_context_row_says_when_the_windows_are_past_it():
    assert trained_context_summary({"trained_context": 8192, "seq_len": 512}) == "8192 tokens"
    assert trained_context_summary({"trained_context": 8192, "seq_len": 16384}) == (
        "8192 tokens; the windows (16384 tokens) are past it")
    assert trained_context_summary({"trained_context": 512, "seq_len": [128, 1024]}) == (
        "512 tokens; the windows (1024 tokens) are past it")  # several lengths: the longest
    assert trained_context_summary({"trained_context": None}) == "not named by the config"
    assert trained_context_summary({"seq_len": 512}) == "—"  # a run written before the manifest recorded it
