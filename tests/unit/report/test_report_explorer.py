"""``report/explorer_page.py``: the JSON the page's script reads, and the fragment around it.

Checked: the heads grid's metrics are the table's per-head metrics with one value per head
(``p0_mass`` first, NaN as null, metrics with several rows per head left out) plus the explorer's
own position-0 mass; windows, heads and blocks follow ``explorer.npz``; the notes give the
precision and what was left out; text in labels cannot close the script element.
"""

from __future__ import annotations

import json

import numpy as np
import pandas as pd

from sinkscope.store.explorer_format import fit, labels_bytes
from sinkscope.report.explorer_page import fragment, head_metrics, payload, standalone
from explorer_fixtures import synthetic

MANIFEST = {"probes": {"p0_mass": {"metrics": {"p0_mass": {"title": "Position-0 mass"}}}}}


def table() -> pd.DataFrame:
    rows = [("p0_mass", l, h, 0.1 * l + 0.01 * h, None) for l in range(3) for h in range(4)]
    rows += [("value_norm_ratio", l, h, np.nan if (l, h) == (1, 1) else 2.0, None) for l in range(3) for h in range(4)]
    rows += [("junk_drop", 0, h, 0.5, dose) for h in range(4) for dose in (1, 2)]  # two rows per head
    rows += [("p0_mass", 0, None, 0.2, None), ("p0_mass", None, None, 0.2, None)]
    frame = pd.DataFrame(rows, columns=["metric", "layer", "head", "value", "dose"])
    frame["layer"] = frame["layer"].astype("Int64")
    frame["head"] = frame["head"].astype("Int64")
    return frame


def test_the_grid_metrics_are_the_tables_per_head_metrics():
    data = synthetic()
    metrics = head_metrics(table().iloc[::-1], MANIFEST, data)
    assert [m["name"] for m in metrics] == ["p0_mass", "value_norm_ratio", "p0_mass_stored_windows"]
    assert metrics[0]["label"] == "Position-0 mass" and metrics[1]["label"] == "value_norm_ratio"
    assert metrics[0]["values"][2][3] == 0.23
    assert metrics[1]["values"][1][1] is None
    assert np.allclose(metrics[2]["values"], data.p0.round(6), atol=1e-6)


def test_the_payload_follows_the_file():
    data, _ = fit(synthetic(W=2, K=3), labels_bytes(synthetic()) + 1)  # room for no pattern
    assert data.kept() == []
    data = synthetic()
    page = payload("run-a", table(), MANIFEST, data)
    assert page["windows"][1]["index"] == 5 and page["windows"][1]["tokens"][2] == "w1t2"
    assert page["heads"][2] == {"layer": 1, "head": 3, "chosen": "sample"}
    assert [(b["window"], b["head"]) for b in page["blocks"]] == data.kept()
    assert page["blocks"][0]["n"] == int(data.blocks[0, 0, 1] - data.blocks[0, 0, 0])
    assert page["has_phantom"] and page["weight_scale"] == data.scale
    assert "within 0.001 of the model's" in page["notes"][0]
    assert page["notes"][1] == "Heads kept: 2 of highest position-0 mass; 1 drawn at random (--seed)."
    kept, _ = fit(data, labels_bytes(data) + len(data.block_text(0, 0)) + 70)
    assert "Left out to keep the page small (--explore-max-mb): window 0 L2.H0" in payload("a", table(), MANIFEST, kept)["notes"][2]


def test_labels_cannot_close_the_script():
    data = synthetic()
    data.labels = data.labels.astype("<U20")
    data.labels[0, 1] = "</script><b>&"
    html = fragment("a <b>", table(), MANIFEST, data, script=False)
    assert "</script><b>" not in html.split('class="sx-data">', 1)[1].split("</script>", 1)[0]
    body = html.split('class="sx-data">', 1)[1].split("</script>", 1)[0]
    assert json.loads(body)["windows"][0]["tokens"][1] == "</script><b>&"
    assert 'data-sinkscope-explorer="a &lt;b&gt;"' in html
    page = standalone("a", table(), MANIFEST, data)
    assert page.startswith("<!DOCTYPE html>") and page.count("<script>") == 1


def test_the_script_is_one_function_joined_from_one_file_per_view():
    """issue 55, item 5: static/explorer/*.js, one file per view, joined in name order inside one function."""
    from importlib import resources

    from sinkscope.report.explorer_page import explorer_script

    folder = resources.files("sinkscope.report").joinpath("static", "explorer")
    views = sorted(entry.name for entry in folder.iterdir() if entry.name.endswith(".js") and not entry.name.startswith("_"))
    assert views == ["00-util.js", "10-explorer.js", "20-store.js", "30-page-api.js", "40-grid.js", "50-pattern.js",
                     "60-pointer.js", "70-text.js", "90-start.js"]
    text = explorer_script()
    assert text.split("\n(function () {", 1)[0].startswith("/* sinkscope attention explorer") and text.rstrip().endswith("})();")
    positions = [text.index(f"// {name}:") for name in views]
    assert positions == sorted(positions)
    assert all(len(folder.joinpath(name).read_text().splitlines()) < 450 for name in views)
