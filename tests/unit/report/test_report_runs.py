"""``report/runs.py``: run folders read, runs grouped and split by length, what a run's table holds.

Tables are built by hand from ``Row`` objects (``rows_to_frame``); the reference is those rows:
a group's value is the mean of its members' rows, a split run holds exactly the rows of its
length, and the uniform p0 floor is the mean over i = 1 .. T-1 of 1/(i+1) computed here.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from sinkscope.errors import SinkscopeError
from sinkscope.report.runs import (RunData, _has_heads, _has_layers, _has_phantom, _model_value, _probe_options,
                                   _seq_len, group_runs, read_run, run_condition, run_lengths, split_lengths,
                                   uniform_p0)
from sinkscope.store.results import Row, rows_to_frame


def per_layer_rows(metric: str, values: list[float], heads: int = 2, **conditions) -> list[Row]:
    """Per-head rows, per-layer means and the model mean of one metric."""
    extra = tuple(conditions.items())
    rows = []
    for layer, value in enumerate(values):
        rows += [Row(metric, metric, layer, h, value, 4, extra) for h in range(heads)]
        rows.append(Row(metric, metric, layer, None, value, 8, extra))
    rows.append(Row(metric, metric, None, None, float(np.mean(values)), 16, extra))
    return rows


def run_of(rows: list[Row], label: str = "r", manifest: dict | None = None, conditions: dict | None = None) -> RunData:
    return RunData(Path(label), label, manifest or {}, rows_to_frame(rows, conditions))


def test_uniform_p0_is_the_mean_over_queries_of_one_over_their_keys():
    assert uniform_p0(32) == pytest.approx(np.mean([1 / (i + 1) for i in range(1, 32)]))
    assert uniform_p0(2) == pytest.approx(0.5)
    assert np.isnan(uniform_p0(1)) and np.isnan(uniform_p0(0))


def test_what_a_table_holds():
    run = run_of(per_layer_rows("p0_mass", [0.2, 0.4]) + [Row("m", "model_only", None, None, 3.0, 1)]
                 + [Row("p0_mass", "p0_mass", None, None, 9.0, 1, (("layer_type", "sliding"),))])
    assert _has_layers(run.table, "p0_mass") and _has_heads(run.table, "p0_mass")
    assert not _has_layers(run.table, "model_only") and not _has_heads(run.table, "model_only")
    assert _model_value(run.table, "p0_mass") == pytest.approx(0.3)  # not the sliding layers' mean
    assert _model_value(run.table, "model_only") == 3.0 and _model_value(run.table, "absent") is None


def test_phantom_key_from_the_spec_else_from_the_values():
    zeros = per_layer_rows("phantom_mass", [0.0, 0.0])
    assert not _has_phantom(run_of(zeros))
    assert _has_phantom(run_of(per_layer_rows("phantom_mass", [0.0, 0.1])))
    assert _has_phantom(run_of(zeros, manifest={"model": {"spec": {"has_phantom": True}}}))


def test_manifest_lookups_tolerate_what_is_missing():
    run = run_of([], manifest={"windows": {"seq_len": 64}, "probes": {"heads": {"options": {"k": 1}}, "bad": 3}})
    assert _seq_len(run) == 64 and _seq_len(run_of([], manifest={"windows": "x"})) is None
    assert _probe_options(run, "heads") == {"k": 1}
    assert _probe_options(run, "bad") == {} and _probe_options(run, "absent") == {}


def test_group_runs_averages_the_members_and_keeps_probe_conditions_apart():
    a = run_of(per_layer_rows("p0_mass", [0.2, 0.4], dose=0.5), "a", {"conditions": {"variant": "x", "seed": 0}},
               {"variant": "x", "seed": 0})
    b = run_of(per_layer_rows("p0_mass", [0.4, 0.8], dose=0.5), "b", {"conditions": {"variant": "x", "seed": 1}},
               {"variant": "x", "seed": 1})
    c = run_of(per_layer_rows("p0_mass", [0.1, 0.1], dose=0.5), "c", {"conditions": {"variant": "y", "seed": 0}},
               {"variant": "y", "seed": 0})
    x, y = group_runs([a, b, c], "variant")
    assert x.label == "variant=x (mean of 2 runs)" and y.label == "variant=y"
    layer1 = x.table[(x.table.layer == 1) & x.table["head"].isna()]
    assert layer1["value"].tolist() == [pytest.approx(0.6)] and layer1["n"].tolist() == [16]
    assert "dose" in x.table.columns and "seed" not in x.table.columns
    assert x.manifest["grouped"] == {"by": "variant", "value": "x", "runs": ["a", "b"]}
    assert run_condition(a, "seed") == 0
    with pytest.raises(SinkscopeError, match="no condition 'tier'"):
        run_condition(a, "tier")


def test_split_lengths_gives_one_run_per_length_without_the_leak_fit():
    rows = [Row(r.probe, r.metric, r.layer, r.head, r.value * n, r.n, (("seq_len", n),))
            for n in (8, 32) for r in per_layer_rows("p0_mass", [0.2, 0.4])]
    rows.append(Row("leak_fit", "leak_delta", 0, 0, 1.5, 1, (("seq_len", 8),)))
    multi = run_of(rows, "m", {"windows": {"seq_len": 32}})
    plain = run_of(per_layer_rows("p0_mass", [0.3, 0.3]), "p")
    assert run_lengths(multi) == [8, 32] and run_lengths(plain) == []
    out, several = split_lengths([multi, plain])
    assert several == [multi] and [r.label for r in out] == ["m · seq-len 8", "m · seq-len 32", "p"]
    eight = out[0]
    assert "seq_len" not in eight.table.columns and set(eight.table.probe) == {"p0_mass"}
    assert eight.manifest["windows"]["seq_len"] == 8 and multi.manifest["windows"]["seq_len"] == 32
    np.testing.assert_allclose(eight.table["value"], [r.value * 8 for r in per_layer_rows("p0_mass", [0.2, 0.4])])
    alone, _ = split_lengths([multi])
    assert [r.label for r in alone] == ["seq-len 8", "seq-len 32"]


def test_read_run_refuses_what_is_not_a_run_folder(tmp_path):
    with pytest.raises(SinkscopeError, match="is not a folder"):
        read_run(tmp_path / "absent")
    with pytest.raises(SinkscopeError, match="no manifest.json"):
        read_run(tmp_path)
    (tmp_path / "manifest.json").write_text(json.dumps({"format_version": -1}))
    with pytest.raises(SinkscopeError, match="run format -1"):
        read_run(tmp_path)
