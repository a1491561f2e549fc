"""The table a real tiny ``sinks`` run writes (SPEC.md "Tables"; issue 61, item 8): every model row has
its ``se`` where the spec says one exists and none elsewhere, a metric measured per layer never carries
a head, and ``n`` is the windows (the ``se``'s unit) except where a metric names another unit.

The tiny gpt-oss has a learned sink (``sink_logit``: a parameter, no se) and sliding layers (the
``*_in_reach`` and ``layer_type`` rows); the tiny Llama has neither.
"""

from __future__ import annotations

import math

import pandas as pd
import pytest

import sinkscope
from tiny_models import build, random_ids

WINDOWS = 5
#: model rows that are means over windows: their se is the sd over windows of each window's model value.
MODEL_SE = {"p0_mass", "p0_out_of_reach", "sink_rate", "sink_alpha", "sink_rate_in_reach", "sink_alpha_in_reach",
            "sink_rate_from_layer", "phantom_mass", "value_norm_ratio"}
#: model rows without one, each for the reason its doc gives (a share of heads, a ratio of means, a
#: parameter, maxima and where they lie).
NO_SE = {"sink_head_share", "p0_mass_in_reach", "sink_logit", "massive_activation", "massive_activation_ratio",
         "massive_activation_channel", "massive_activation_position", "massive_activation_layer"}
#: metrics whose n is not the windows: the heads counted, a parameter read once.
OTHER_N = {"sink_head_share", "sink_logit"}


@pytest.fixture(scope="module", params=["llama", "gpt_oss"])
def run(request):
    model = build(request.param)
    ids = random_ids(WINDOWS, 16, seed=2).numpy()
    return sinkscope.measure("sinks", model, windows=ids, batch_size=2, progress=False, explore_windows=0)


def _model_rows(table: pd.DataFrame) -> pd.DataFrame:
    rows = table[table["layer"].isna() & table["head"].isna()]
    return rows[rows["layer_type"].isna()] if "layer_type" in rows.columns else rows


def test_every_model_row_has_its_se_where_one_exists(run):
    rows = _model_rows(run.table)
    metrics = set(rows["metric"])
    assert metrics <= MODEL_SE | NO_SE, f"decide whether these model rows have an se: {metrics - MODEL_SE - NO_SE}"
    assert {"p0_mass", "sink_rate", "sink_alpha", "sink_rate_from_layer", "phantom_mass"} <= metrics
    for row in rows.itertuples(index=False):
        if row.metric in MODEL_SE:
            assert math.isfinite(row.se) and row.se >= 0, row
        else:
            assert math.isnan(row.se), row
    p0 = rows[rows["metric"] == "p0_mass"].iloc[0]
    assert p0["se"] > 0


def test_layer_type_rows_have_no_se(run):
    sliding = any(w is not None for w in run.manifest["model"]["layer_windows"])
    assert ("layer_type" in run.table.columns) == sliding
    if sliding:
        typed = run.table[run.table["layer_type"].notna()]
        assert len(typed) and typed["se"].isna().all() and typed["layer"].isna().all()


def test_a_per_layer_metric_never_carries_a_head(run):
    per = {metric: info["per"] for probe in run.manifest["probes"].values() for metric, info in probe["metrics"].items()}
    by_layer = [m for m, p in per.items() if p in ("layer", "model")]
    assert "massive_activation" in by_layer and "sink_head_share" in by_layer
    rows = run.table[run.table["metric"].isin(by_layer)]
    assert len(rows) and rows["head"].isna().all()
    assert str(run.table["layer"].dtype) == "Int64" and str(run.table["head"].dtype) == "Int64"


def test_n_is_the_windows_except_where_a_metric_names_another_unit(run):
    table = run.table
    windowed = table[~table["metric"].isin(OTHER_N)]
    assert (windowed["n"] == WINDOWS).all(), windowed[windowed["n"] != WINDOWS][["metric", "layer", "head", "n"]]
    heads = table[(table["metric"] == "sink_head_share") & table["layer"].notna()]
    assert (heads["n"] == run.manifest["model"]["spec"]["n_heads"]).all()
    assert (table.loc[table["metric"] == "sink_logit", "n"] == 1).all()
