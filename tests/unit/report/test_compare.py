"""``report/compare.py`` and ``report/compare_section.py``: the differences between runs, and their se.

The runs are real tiny runs (``tests/golden``): a ``stream`` run, which keeps every token's NLL per
window (``stream_nll.npy``), and a ``sinks`` run, which does not. A second run is the first with
its per-window NLL moved by a known amount; the reference for every se is computed here with numpy
from the files alone: paired, ``sd(b_i - a_i, ddof=1) / sqrt(n)`` over the windows' mean NLLs (for a
perplexity ``ppl x`` that mean, the delta method); unpaired, ``sqrt(se_a^2 + se_b^2)`` of the tables'
own ses (SPEC.md "Comparisons of runs").
"""

from __future__ import annotations

import math
import shutil
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from repo_paths import GOLDEN
from sinkscope.report import compare_section
from sinkscope.report.compare import (DIFFERENT_WINDOWS, GROUPS, NOT_STORED, PAIRED, compare_folders, differences,
                                      model_rows, write_differences)
from sinkscope.report.runs import RunData
from sinkscope.report.summary import read_summary_run
from sinkscope.stats.paired import paired_difference, unpaired_se

STREAM = GOLDEN / "run_stream_llama"


def test_paired_difference_is_the_se_of_the_per_window_differences():
    a, b = np.array([1.0, 2.0, 4.0, 7.0]), np.array([1.5, 2.1, 4.9, 7.2])
    mean, se, n = paired_difference(a, b)
    d = b - a
    assert mean == pytest.approx(d.mean()) and n == 4
    assert se == pytest.approx(np.std(d, ddof=1) / 2)
    # the unpaired se of the same numbers is far wider: what the windows share does not cancel
    assert unpaired_se(np.std(a, ddof=1) / 2, np.std(b, ddof=1) / 2) > 10 * se
    assert math.isnan(paired_difference([1.0], [2.0])[1])
    with pytest.raises(ValueError, match="one value per window"):
        paired_difference([1.0, 2.0], [1.0])


def test_unpaired_se_adds_the_variances():
    assert unpaired_se(0.3, 0.4) == pytest.approx(0.5)
    assert math.isnan(unpaired_se(0.3, float("nan"))) and math.isnan(unpaired_se(None, 0.4))


def _stream_pair(tmp_path: Path, shift: np.ndarray) -> tuple[RunData, RunData, np.ndarray, np.ndarray]:
    """The golden stream run and a copy whose NLL of every token of window w moves by ``shift[w]`` (plus a
    per-token wobble), with both runs' per-token NLL."""
    other = Path(shutil.copytree(STREAM, tmp_path / "other"))
    nll = np.load(STREAM / "stream_nll.npy")
    wobble = np.random.default_rng(0).normal(0.0, 0.05, nll.shape).astype(nll.dtype)
    moved = (nll + shift[None, :, None] + wobble).astype(nll.dtype)
    np.save(other / "stream_nll.npy", moved)
    return read_summary_run(STREAM, "a"), read_summary_run(other, "b"), nll, moved


def _row(frame: pd.DataFrame, metric: str, policy: str, bucket: bool = False) -> pd.Series:
    rows = frame[(frame["metric"] == metric) & (frame["policy"] == policy)]
    rows = rows[rows["position_bucket"].notna() if bucket else rows["position_bucket"].isna()]
    return rows.iloc[0]


def test_runs_on_the_same_windows_are_paired_over_their_windows(tmp_path):
    a, b, nll_a, nll_b = _stream_pair(tmp_path, np.array([0.2, -0.1]))
    conditions = a.manifest["probes"]["stream"]["options"]["conditions"]
    c = next(i for i, cond in enumerate(conditions) if cond["policy"] == "window" and cond["positions"] == "cache")
    frame = differences([a, b])

    row = _row(frame[frame["positions"] == "cache"], "stream_nll", "window")
    per_doc_a, per_doc_b = nll_a[c].astype(np.float64).mean(1), nll_b[c].astype(np.float64).mean(1)
    assert row["pairing"] == PAIRED and row["n_windows"] == 2
    assert row["se"] == pytest.approx(np.std(per_doc_b - per_doc_a, ddof=1) / math.sqrt(2), rel=1e-9)
    assert row["difference"] == pytest.approx(row["value"] - row["reference_value"])

    ppl = _row(frame[frame["positions"] == "cache"], "stream_ppl", "window")
    lin_a, lin_b = math.exp(per_doc_a.mean()) * per_doc_a, math.exp(per_doc_b.mean()) * per_doc_b
    assert ppl["pairing"] == PAIRED
    assert ppl["se"] == pytest.approx(np.std(lin_b - lin_a, ddof=1) / math.sqrt(2), rel=1e-9)

    # the p0 mass beside it keeps no per-window values: the same windows, unpaired
    p0 = frame[(frame["metric"] == "p0_mass") & frame["layer"].notna() & frame["head"].notna()].iloc[0]
    se_a = a.table[(a.table["metric"] == "p0_mass") & (a.table["layer"] == p0["layer"])
                   & (a.table["head"] == p0["head"])]["se"].iloc[0]
    assert p0["pairing"] == NOT_STORED and p0["se"] == pytest.approx(math.hypot(se_a, se_a))
    assert pd.isna(p0["n_windows"])


def test_runs_on_other_windows_are_unpaired(tmp_path):
    a, b, _, _ = _stream_pair(tmp_path, np.array([0.2, -0.1]))
    b.manifest["windows"] = {**b.manifest["windows"], "tokens_sha256": "0" * 64}  # another tokenizer's windows
    frame = differences([a, b])
    row = _row(frame[frame["positions"] == "cache"], "stream_nll", "window")
    se_a = _row(a.table[a.table["positions"] == "cache"], "stream_nll", "window")["se"]
    assert row["pairing"] == DIFFERENT_WINDOWS and pd.isna(row["n_windows"])
    assert row["se"] == pytest.approx(math.hypot(se_a, se_a))
    assert set(frame["pairing"]) == {DIFFERENT_WINDOWS}

    section = compare_section.section([a, b])
    assert section["reference"] == "a" and len(section["notes"]) == 1 and "b did not measure" in section["notes"][0]
    assert {r[5] for r in section["rows"]} == {"unpaired: different windows"}


def test_sinks_runs_pair_no_row_and_every_shared_row_has_an_unpaired_se(tmp_path):
    shutil.copytree(GOLDEN / "run_tiny_llama", tmp_path / "b")
    frame = compare_folders([GOLDEN / "run_tiny_llama", tmp_path / "b"], labels=["a", "b"])
    assert set(frame["pairing"]) == {NOT_STORED} and (frame["difference"] == 0).all()
    heads = frame[frame["head"].notna()]
    assert heads["se"].notna().all()  # per-head rows carry an se in both runs
    model = model_rows(frame)
    assert set(model["metric"]) >= {"p0_mass", "sink_rate"}
    means = model[model["metric"].isin(["p0_mass", "sink_rate"])]  # means over windows: an se (SPEC.md "Tables")
    a = read_summary_run(GOLDEN / "run_tiny_llama", "a").table
    for row in means.itertuples():
        se = a[(a["metric"] == row.metric) & a["layer"].isna() & a["head"].isna()]["se"].iloc[0]
        assert row.se == pytest.approx(np.hypot(se, se))  # sqrt(se_a^2 + se_b^2), the runs' per-window values unkept


def test_grouped_runs_carry_no_se():
    a = read_summary_run(GOLDEN / "run_tiny_llama", "a")
    b = read_summary_run(GOLDEN / "run_tiny_llama", "b")
    b.manifest = {**b.manifest, "grouped": {"by": "variant", "value": "x", "runs": []}}
    frame = differences([a, b])
    assert set(frame["pairing"]) == {GROUPS} and frame["se"].isna().all()
    assert "no standard error" in compare_section.window_notes([a, b])[0]


def test_compare_csv_holds_every_shared_row(tmp_path):
    a, b, _, _ = _stream_pair(tmp_path, np.array([0.2, -0.1]))
    frame = differences([a, b])
    path = write_differences(tmp_path, frame)
    back = pd.read_csv(path)
    assert path.name == "compare.csv" and len(back) == len(frame) == len(b.table)
    assert list(back.columns[:6]) == ["run", "reference", "probe", "metric", "layer", "head"]
    assert list(back.columns[-6:]) == ["value", "reference_value", "difference", "se", "pairing", "n_windows"]
    np.testing.assert_allclose(back["se"], frame["se"].astype(float), rtol=1e-8)


def test_the_page_section_names_each_pairing(tmp_path):
    a, b, _, _ = _stream_pair(tmp_path, np.array([0.2, -0.1]))
    section = compare_section.section([a, b])
    assert section["notes"] == [] and section["columns"][3] == "value of a"
    by_metric = {r[1]: r for r in section["rows"]}
    full = by_metric["stream_ppl (policy=full, sink_tokens=0, positions=original)"]
    assert full[0] == "b" and full[5] == "paired over 2 windows" and " ± " in full[4]
    assert by_metric["p0_mass"][5] == "unpaired: per-window values not stored (same windows)"
    assert compare_section.section([a]) is None
