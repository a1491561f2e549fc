"""``report/curves.py``: curves against the training step, the dose and the context length.

Each figure is drawn from small hand-made frames; the reference is those frames: every line must
carry exactly their x and y (sorted by x), in the order and style the docstrings promise, and a
y label names the metric through the ``MetricLabels`` handed in (none: the raw name).
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from sinkscope.report import curves
from sinkscope.report.figures import MetricLabels


def test_loss_curves_draw_validation_and_training_loss_per_checkpoint():
    log = pd.DataFrame({"step": [2, 1, 3], "train_loss": [2.0, 3.0, 1.5], "val_loss": [np.nan, 2.9, 1.6]})
    ax = curves.loss_curves({"a": log}).axes[0]
    val, train = ax.lines
    np.testing.assert_array_equal(val.get_xdata(), [1, 3])
    np.testing.assert_allclose(val.get_ydata(), [2.9, 1.6])
    np.testing.assert_array_equal(train.get_xdata(), [1, 2, 3])
    assert train.get_color() == val.get_color() and val.get_label() == "a: validation"


def test_imbalance_curves_draw_the_model_and_each_layer():
    log = pd.DataFrame({"step": [1, 2], "load_imbalance": [0.5, 0.7], "load_imbalance_l1": [0.4, 0.6],
                        "load_imbalance_l0": [0.6, 0.8]})
    model, first, second = curves.imbalance_curves({"a": log}).axes[0].lines
    np.testing.assert_allclose(model.get_ydata(), [0.5, 0.7])
    np.testing.assert_allclose(first.get_ydata(), [0.6, 0.8])  # layers in their order, l0 first
    np.testing.assert_allclose(second.get_ydata(), [0.4, 0.6])


def test_dose_response_leaves_out_what_a_log_axis_cannot_show():
    points = pd.DataFrame({"run": "r", "cutoff": ["median"] * 3 + ["q25"] * 3, "dose": [2.0, 0.5, 1.0] * 2,
                           "value": [0.4, -0.1, 0.2, 0.3, 0.1, 0.2], "se": np.nan})
    ax = curves.dose_response(points, "gaussian").axes[0]
    median, q25 = ax.lines
    np.testing.assert_allclose(median.get_xdata(), [1.0, 2.0])
    np.testing.assert_allclose(median.get_ydata(), [0.2, 0.4])  # the dose of -0.1 is left out
    np.testing.assert_allclose(q25.get_xdata(), [0.5, 1.0, 2.0])
    assert median.get_linestyle() == "-" and q25.get_linestyle() == "--" and ax.get_yscale() == "log"
    nothing = curves.dose_response(points.assign(value=-1.0), "copy").axes[0]
    assert not nothing.lines and nothing.texts[0].get_text() == "no positive loss increase to draw"


def test_metric_vs_length_draws_a_line_per_layer_the_fit_dashed_and_the_floor():
    points = pd.DataFrame({"layer": [0, 0, 1, 1], "seq_len": [32, 8, 8, 32], "value": [0.1, 0.5, 0.4, 0.2]})
    predicted = pd.DataFrame({"layer": [0, 0], "seq_len": [8, 32], "value": [0.5, 0.3]})
    ax = curves.metric_vs_length(points, "p0_mass", predicted=predicted, floor={8: 0.3, 32: 0.1}).axes[0]
    layer0, fit0, layer1, floor = ax.lines
    np.testing.assert_allclose(layer0.get_xdata(), [8, 32])
    np.testing.assert_allclose(layer0.get_ydata(), [0.5, 0.1])
    assert fit0.get_linestyle() == "--" and fit0.get_color() == layer0.get_color()
    np.testing.assert_allclose(layer1.get_ydata(), [0.4, 0.2])
    assert floor.get_label() == "uniform attention" and ax.get_xscale() == "log"


def test_metric_vs_step_draws_layers_then_the_model_line_in_black():
    lines = {"layer 0": pd.DataFrame({"step": [10, 0], "value": [0.5, 0.1]}),
             curves.MODEL_LINE: pd.DataFrame({"step": [0, 10], "value": [0.2, 0.4]})}
    fig = curves.metric_vs_step(lines, "p0_mass", floor=0.25)
    layer, model, floor = fig.axes[0].lines
    np.testing.assert_allclose(layer.get_xdata(), [0, 10])
    np.testing.assert_allclose(layer.get_ydata(), [0.1, 0.5])
    assert model.get_color() == "black" and model.get_label() == curves.MODEL_LINE
    assert floor.get_label() == "uniform attention (0.25)" and fig.axes[0].get_ylabel() == "p0_mass"
    named = curves.metric_vs_step(lines, "p0_mass", x_labels={0.0: "main", 10.0: "v2"},
                                  labels=MetricLabels({"p0_mass": ("P0 mass", "share")}))
    ax = named.axes[0]
    assert ax.get_ylabel() == "P0 mass (share)" and ax.get_xlabel() == "revision"
    assert [t.get_text() for t in ax.get_xticklabels()] == ["main", "v2"]
