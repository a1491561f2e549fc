"""The lab's figures (report/lab_figures.py): each draws the sweep's or the toy task's table it is given,
with one bar or point per row, and draws nothing from an empty table."""

from __future__ import annotations

import pandas as pd
from matplotlib.figure import Figure

from sinkscope.report import lab_figures


def test_table1_bars_one_per_comparison_and_none_without_rows():
    t1 = pd.DataFrame({"variant": ["sinklogit", "normgate"], "reference": ["baseline", "baseline"],
                       "improvement": [0.02, -0.01], "se": [0.005, None], "block": ["over baseline"] * 2})
    fig = lab_figures.paired_improvement_bars(t1)
    assert isinstance(fig, Figure) and len(fig.axes[0].patches) == 2
    assert lab_figures.paired_improvement_bars(t1.iloc[:0]) is None


def test_improvement_by_step_needs_two_steps():
    rows = pd.DataFrame({"variant": ["a", "a"], "step": [10, 20], "improvement": [0.1, 0.2], "se": [0.01, 0.02]})
    fig = lab_figures.improvement_by_step(rows)
    assert [line.get_label() for line in fig.axes[0].get_lines() if not line.get_label().startswith("_")] == ["a"]
    assert lab_figures.improvement_by_step(rows.iloc[:1]) is None


def test_sink_columns_one_panel_per_column_present():
    sinks = pd.DataFrame({"variant": ["baseline", "sinklogit"], "p0_pct": [40.0, 5.0], "phantom_pct": [None, 60.0]})
    fig = lab_figures.sink_columns_by_variant(sinks)
    assert [ax.get_title() for ax in fig.axes] == ["position-0 mass (%)", "phantom mass (%)"]
    assert lab_figures.sink_columns_by_variant(pd.DataFrame({"variant": ["a"]})) is None


def test_toy_figure_has_two_rows_per_condition():
    summary = pd.DataFrame({"condition": ["blind"] * 4, "variant": ["baseline", "baseline", "normgate", "normgate"],
                            "load": [1, 2, 1, 2], "error": [0.5, 0.6, 0.4, 0.45], "se": [0.01] * 4,
                            "headroom_closed": [0.0, 0.0, 0.3, 0.4]})
    fig = lab_figures.toy_error_by_load(summary, {"blind": "channel-blind"})
    assert len(fig.axes) == 2 and fig.axes[0].get_title() == "channel-blind"


def test_one_colour_per_variant_in_every_toy_panel_and_a_legend_on_each():
    summary = pd.DataFrame({"condition": ["blind"] * 6 + ["visible"] * 6,
                            "variant": ["baseline", "normgate", "sinklogit"] * 4,
                            "load": [1, 1, 1, 2, 2, 2] * 2, "error": [0.5] * 12, "se": [0.01] * 12,
                            "headroom_closed": [0.0, 0.3, 0.2] * 4})
    fig = lab_figures.toy_error_by_load(summary, {})
    colour = {}
    for ax in fig.axes:
        assert ax.get_legend() is not None
        handles, labels = ax.get_legend_handles_labels()
        for handle, label in zip(handles, labels):
            line = handle.lines[0] if hasattr(handle, "lines") else handle  # an errorbar's data line
            assert colour.setdefault(label, line.get_color()) == line.get_color()
    assert len(set(colour.values())) == 3
