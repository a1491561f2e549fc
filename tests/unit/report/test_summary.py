"""``report/summary.py``: the numbers a measuring command prints, and ``sinkscope ls runs``.

The runs are real tiny runs (``tests/golden``: a tiny Llama and a tiny gpt-oss measured by
``sinks``, a tiny Llama by ``stream``); the reference for every headline value is the run's own
``results.csv`` read here with pandas, and for the rounding a hand-written string.
"""

from __future__ import annotations

import json
import math
import shutil
from pathlib import Path

import pandas as pd
import pytest
from typer.testing import CliRunner

from repo_paths import GOLDEN
from sinkscope.cli import app
from sinkscope.errors import SinkscopeError
from sinkscope.report.summary import (HEADLINES, TOP_HEADS, format_listing, format_summary, fmt_value_se, list_runs,
                                      summarise)
from sinkscope.store.comparison_record import write_comparison_record


@pytest.mark.parametrize(("value", "se", "printed"), [
    (0.0348732, 2.02109e-05, "0.034873 ± 0.000020"),  # the se's first two significant digits: 2.0e-05
    (0.09874, 0.00029, "0.09874 ± 0.00029"),
    (520.0221939, 5.5634702, "520.0 ± 5.6"),
    (6.25387149, 0.019, "6.254 ± 0.019"),
    (1234.5, 567.0, "1230 ± 570"),  # an se above 10: the value rounds to its tens
    (0.0987066, None, "0.09871"),  # no se (a model row): four significant digits
    (0.0987066, math.nan, "0.09871"),
    (math.nan, 0.1, "—"),
])
def test_a_value_is_rounded_where_its_ses_second_significant_digit_ends(value, se, printed):
    assert fmt_value_se(value, se) == printed


def test_a_difference_carries_its_sign():
    assert fmt_value_se(0.64381, 4.7137, sign=True) == "+0.6 ± 4.7"
    assert fmt_value_se(-0.0256122, 0.0154102, sign=True) == "-0.026 ± 0.015"


def _model_rows(folder: Path) -> pd.DataFrame:
    table = pd.read_csv(folder / "results.csv")
    return table[table["layer"].isna() & table["head"].isna()]


def test_a_sinks_run_shows_its_model_rows_and_top_heads():
    run = GOLDEN / "run_tiny_llama"
    summary = summarise(run)
    assert summary["command"] == "sinks" and summary["model"] == "tiny-llama"
    assert summary["windows"]["n_seqs"] == 6 and summary["windows"]["seq_len"] == 32
    # p0_mass, sink_rate and value_norm_ratio: a Llama has no learned phantom, so no phantom_mass row is shown
    assert [m["metric"] for m in summary["metrics"]] == ["p0_mass", "sink_rate", "value_norm_ratio"]
    rows = _model_rows(run).set_index("metric")
    for metric in summary["metrics"]:
        assert metric["value"] == pytest.approx(rows.loc[metric["metric"], "value"], rel=1e-9)
        assert metric["se"] == pytest.approx(rows.loc[metric["metric"], "se"], rel=1e-9)  # over windows (SPEC.md "Tables")
    heads = pd.read_csv(run / "results.csv")
    heads = heads[(heads["metric"] == "p0_mass") & heads["head"].notna()].sort_values("value", ascending=False)
    top = summary["top_heads"]
    assert top["metric"] == HEADLINES["sinks"].top and top["order"] == "highest" and len(top["heads"]) == TOP_HEADS
    assert [(h["layer"], h["head"]) for h in top["heads"]] == [
        (int(r.layer), int(r.head)) for r in heads.head(TOP_HEADS).itertuples()]
    assert top["heads"][0]["se"] == pytest.approx(heads["se"].iloc[0])

    text = format_summary(summary).splitlines()
    assert text[0] == "sinks · tiny-llama · 6 windows of 32 tokens, seed 0"
    assert text[1].split() == ["metric", "value"] and text[2].split()[0] == "p0_mass"
    assert " ".join(text[2].split()[1:]) == fmt_value_se(rows.loc["p0_mass", "value"], rows.loc["p0_mass", "se"])
    first = top["heads"][0]
    assert f"{first['layer']}.{first['head']}" in text[7] and "±" in text[7]


def test_a_model_with_a_learned_sink_shows_its_phantom_mass():
    assert "phantom_mass" in [m["metric"] for m in summarise(GOLDEN / "run_tiny_gpt_oss")["metrics"]]


def test_the_summary_is_json():
    for name in ("run_tiny_llama", "run_stream_llama", "run_inject_llama"):
        summary = summarise(GOLDEN / name)
        again = json.loads(json.dumps(summary, allow_nan=False))  # no NaN: a missing se is null
        assert again["metrics"] and again["path"] == str(GOLDEN / name)


def _comparison(tmp_path: Path, names: list[str]) -> Path:
    folder = tmp_path / "cmp"
    folder.mkdir()
    for name in names:
        shutil.copytree(GOLDEN / "run_tiny_llama", folder / name)
    write_comparison_record(folder, names, None, None, False)
    return folder


def test_a_comparison_has_one_row_per_run_and_the_differences(tmp_path):
    folder = _comparison(tmp_path, ["a", "b"])
    summary = summarise(folder / "report.html")  # the page a comparison prints: its folder's summary
    assert [run["label"] for run in summary["runs"]] == ["a", "b"] and summary["page"] is None
    assert {d["metric"] for d in summary["differences"]} == {"p0_mass", "sink_rate", "value_norm_ratio"}
    assert all(d["difference"] == 0 and d["reference"] == "a" for d in summary["differences"])
    text = format_summary(summary)
    assert "difference from a (± se)" in text and "se unpaired: per-window values not stored" in text


def test_ls_runs_lists_each_run_with_its_command(tmp_path):
    reports = tmp_path / "reports"
    reports.mkdir()
    shutil.copytree(GOLDEN / "run_tiny_llama", reports / "20261201-120000-sinks-tiny-llama-s0-aaaaaa")
    shutil.copytree(GOLDEN / "run_stream_llama", reports / "20261201-120100-stream-tiny-llama-s0-bbbbbb")
    (reports / "notes").mkdir()  # no run: not listed
    listed = list_runs(reports)
    assert [(Path(r["path"]).name, r["command"]) for r in listed] == [
        ("20261201-120000-sinks-tiny-llama-s0-aaaaaa", "sinks"),
        ("20261201-120100-stream-tiny-llama-s0-bbbbbb", "stream")]
    lines = format_listing(listed).splitlines()
    assert lines[0].split()[:4] == ["run", "command", "model", "date"] and len(lines) == 3
    assert " sinks " in lines[1] and "p0_mass" in lines[1] and " stream " in lines[2]

    result = CliRunner().invoke(app, ["ls", "runs", str(reports)])
    assert result.exit_code == 0, result.output
    assert result.output.splitlines()[1:] == lines[1:]
    as_json = CliRunner().invoke(app, ["ls", "runs", str(reports), "--json"])
    assert [r["command"] for r in json.loads(as_json.output)] == ["sinks", "stream"]


def test_ls_runs_of_a_missing_folder_is_one_sentence(tmp_path, monkeypatch):
    result = CliRunner().invoke(app, ["ls", "runs", str(tmp_path / "nowhere")])
    assert result.exit_code == 1
    assert result.output.strip() == f"error: no folder {tmp_path / 'nowhere'} to list runs in."
    monkeypatch.chdir(tmp_path)  # no reports/ yet: nothing to list, and where runs go
    result = CliRunner().invoke(app, ["ls", "runs"])
    assert result.exit_code == 0 and len(result.output.strip().splitlines()) == 1
    assert "no folder reports" in result.output
    with pytest.raises(SinkscopeError, match="no folder"):
        list_runs(tmp_path / "nowhere")


def test_an_unreadable_run_is_listed_with_why(tmp_path):
    broken = tmp_path / "broken"
    shutil.copytree(GOLDEN / "run_tiny_llama", broken)
    (broken / "manifest.json").write_text("{not json")
    (listed,) = list_runs(tmp_path)
    assert listed["command"] is None and "manifest" in listed["error"]
    assert "unreadable" in format_listing([listed])
