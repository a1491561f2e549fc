"""The report: content equals the tables, comparisons, large models, errors, a real browser."""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from typer.testing import CliRunner

from sinkscope.cli import app
from sinkscope.errors import SinkscopeError
from sinkscope.commands.sinks import SINKS_PROBES
from sinkscope.report import build_report
from sinkscope.stats.paired import fmt_pm
from sinkscope.store.results import read_results, rows_to_frame
from sinkscope.store.results import Row
from repo_paths import GOLDEN
from report_pages import parse



@pytest.fixture
def llama_run(tmp_path) -> Path:
    return Path(shutil.copytree(GOLDEN / "run_tiny_llama", tmp_path / "run_tiny_llama"))


@pytest.fixture
def gpt_oss_run(tmp_path) -> Path:
    return Path(shutil.copytree(GOLDEN / "run_tiny_gpt_oss", tmp_path / "run_tiny_gpt_oss"))


def test_report_content_equals_the_table(llama_run):
    page = build_report([llama_run])
    assert page == llama_run / "report.html"
    html = parse(page)
    table = read_results(llama_run)
    assert html.sections == list(SINKS_PROBES)  # one section per probe, in order

    summary = next(rows for attrs, rows in html.tables if attrs.get("class") == "summary")
    header, body = summary[0], summary[1:]
    assert header[:2] == ["metric", "what"]
    model_rows = table[table.layer.isna()].set_index("metric")["value"]
    shown = {row[0]: row[2] for row in body}
    assert set(model_rows.index) <= set(shown)
    for metric, value in model_rows.items():
        assert float(shown[metric]) == pytest.approx(value, rel=1e-5, abs=1e-9), metric

    layer_tables = {attrs["data-metric"]: rows for attrs, rows in html.tables if attrs.get("class") == "layers"}
    for metric in ["p0_mass", "sink_rate", "value_norm_ratio", "massive_activation"]:
        expected = table[(table.metric == metric) & table.layer.notna() & table["head"].isna()]
        rows = layer_tables[metric][1:]
        assert [int(r[0]) for r in rows] == expected.layer.astype(int).tolist()
        # a mean over windows reads value ± se (issue 27 fix 4; the golden tables predate se: none), rounded
        # where the se's second significant digit ends (issue 61); a value without one has 6 digits
        se = expected.se.to_numpy()
        assert [" ± " in r[1] for r in rows] == list(np.isfinite(se)), metric
        assert [r[1] for r in rows if " ± " in r[1]] == [fmt_pm(v, e) for v, e in zip(expected.value, se)
                                                          if np.isfinite(e)], metric
        np.testing.assert_allclose([float(r[1]) for r in rows if " ± " not in r[1]],
                                   expected.value.to_numpy()[~np.isfinite(se)], rtol=1e-5, atol=1e-9)

    text = page.read_text()
    for needle in ["What was run", "SPEC.md", "w_i0", "sigmoid(b_h - LSE_i)", "tiny-llama", "sample.txt"]:
        assert needle in text, needle
    # Self-contained: every image is embedded, nothing points off the page.
    assert all(u.startswith(("data:image/png;base64,", "#")) for u in html.urls), html.urls
    assert not re.search(r"https?://", text)
    assert page.stat().st_size < 3_000_000
    for stem in ["heatmap_p0_mass", "layers_p0_mass", "heatmap_value_norm_ratio", "layers_massive_activation"]:
        assert (llama_run / "figures" / f"{stem}.png").is_file() and (llama_run / "figures" / f"{stem}.svg").is_file()


def test_comparison_overlays_shared_metrics_and_notes_the_rest(llama_run, gpt_oss_run, tmp_path):
    out = tmp_path / "compare"
    result = CliRunner().invoke(app, ["report", str(llama_run), str(gpt_oss_run), "--out", str(out),
                                      "--label", "llama", "--label", "gpt-oss"])
    assert result.exit_code == 0, result.output
    page = out / "report.html"
    html = parse(page)
    summary = next(rows for attrs, rows in html.tables if attrs.get("class") == "summary")
    assert summary[0][2:4] == ["llama", "gpt-oss"]
    phantom = next(r for r in summary[1:] if r[0] == "phantom_mass")
    assert float(phantom[2]) == 0 and float(phantom[3]) > 0.05
    text = page.read_text()
    assert "sink_logit: only in gpt-oss" in text  # gpt-oss has learned sinks, llama has none
    assert not any(r[0] == "sink_logit" for r in summary[1:])
    layer_tables = {attrs["data-metric"]: rows for attrs, rows in html.tables if attrs.get("class") == "layers"}
    assert layer_tables["p0_mass"][0] == ["layer", "llama", "gpt-oss"]
    figures = {p.name for p in (out / "figures").iterdir()}
    assert {"overlay_p0_mass.png", "overlay_p0_mass.svg", "heatmap_p0_mass_run0.png", "heatmap_p0_mass_run1.png"} <= figures
    # The run folders themselves are untouched by a comparison.
    assert not (llama_run / "report.html").exists()


def test_labels_and_tokens_are_text_not_markup(llama_run, gpt_oss_run, tmp_path):
    """A label (or a decoded token such as <bos>) is escaped: the page's markup is never the user's."""
    out = tmp_path / "compare"
    result = CliRunner().invoke(app, ["report", str(llama_run), str(gpt_oss_run), "--out", str(out),
                                      "--label", "<b>x</b>", "--label", "a&b"])
    assert result.exit_code == 0, result.output
    text = (out / "report.html").read_text()
    assert "<b>x</b>" not in text and "&lt;b&gt;x&lt;/b&gt;" in text and "a&amp;b" in text
    summary = next(rows for attrs, rows in parse(out / "report.html").tables if attrs.get("class") == "summary")
    assert summary[0][2:4] == ["<b>x</b>", "a&b"]  # what a reader sees


def test_heatmaps_share_one_colour_scale_across_runs(llama_run, gpt_oss_run):
    from sinkscope.report import figures

    tables = [read_results(llama_run), read_results(gpt_oss_run)]
    values = pd.concat([t[(t.metric == "p0_mass") & t["head"].notna()]["value"] for t in tables])
    lo, hi = float(values.min()), float(values.max())
    for t in tables:
        fig = figures.layer_head_heatmap(t, "p0_mass", vmin=lo, vmax=hi)
        assert fig.axes[0].images[0].get_clim() == (lo, hi)


def test_large_model_report_stays_readable(tmp_path):
    rng = np.random.default_rng(0)
    rows = []
    for layer in range(36):
        values = rng.random(64)
        rows += [Row("p0_mass", "p0_mass", layer, h, float(v), 100) for h, v in enumerate(values)]
        rows.append(Row("p0_mass", "p0_mass", layer, None, float(values.mean()), 6400))
    rows.append(Row("p0_mass", "p0_mass", None, None, 0.5, 230400))
    run = tmp_path / "big"
    run.mkdir()
    rows_to_frame(rows).to_csv(run / "results.csv", index=False)
    (run / "manifest.json").write_text(json.dumps({"format_version": 1, "command": "sinks"}))
    page = build_report([run])
    text = page.read_text()
    assert page.stat().st_size < 2_000_000
    assert re.search(r"<details>\s*<summary>Per-layer table \(36 layers\)", text)  # collapsed


def test_report_errors_are_one_sentence(tmp_path, llama_run):
    runner = CliRunner()
    (tmp_path / "empty").mkdir()
    result = runner.invoke(app, ["report", str(tmp_path / "empty")])
    assert result.exit_code == 1 and "not a sinkscope run folder" in result.output
    manifest = json.loads((llama_run / "manifest.json").read_text())
    manifest["format_version"] = 99
    (llama_run / "manifest.json").write_text(json.dumps(manifest))
    result = runner.invoke(app, ["report", str(llama_run)])
    assert result.exit_code == 1 and "run format 99" in result.output
    with pytest.raises(SinkscopeError, match="at least one run folder"):
        build_report([])
    result = runner.invoke(app, ["report", str(tmp_path / "nope")])
    assert result.exit_code == 1 and "is not a folder" in result.output


@pytest.mark.slow  # drives the browser
def test_report_opens_in_a_headless_browser(llama_run, tmp_path, chromium):
    chromium, sync_api = chromium
    page_path = build_report([llama_run])
    console, requests, failures = [], [], []
    with sync_api.sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=chromium, headless=True, args=[
            "--no-sandbox", "--disable-gpu", "--disable-background-networking", "--disable-component-update",
            "--disable-sync", "--no-first-run"])
        page = browser.new_page(viewport={"width": 1200, "height": 900})
        page.on("console", lambda m: console.append((m.type, m.text)))
        page.on("pageerror", lambda e: failures.append(str(e)))
        page.on("request", lambda r: requests.append(r.url))
        page.on("requestfailed", lambda r: failures.append(r.url))
        page.goto(page_path.as_uri(), wait_until="load")
        assert page.title().startswith("sinkscope report")
        images = page.eval_on_selector_all("img", "els => els.map(e => e.complete && e.naturalWidth > 0)")
        page.screenshot(path=str(tmp_path / "report.png"), full_page=True)
        browser.close()
    assert images and all(images)
    assert not [c for c in console if c[0] in ("error", "warning")], console
    assert not failures
    assert all(u.startswith(("file://", "data:")) for u in requests), requests
    assert (tmp_path / "report.png").stat().st_size > 10_000


@pytest.mark.slow  # trains
def test_report_draws_loss_curves_of_trainer_checkpoints(tmp_path, llama_run, text_file):
    from sinkscope.cli import app as cli

    ckpts = []
    for variant in ("baseline", "sinklogit"):
        ckpt = tmp_path / f"ckpt-{variant}"
        result = CliRunner().invoke(cli, [
            "train", "--variant", variant, "--text-file", str(text_file), "--tokenizer", "bpe300",
            "--windows", "random", "--set", "n_layer=1",
            "--set", "n_head=2", "--set", "n_embd=32", "--set", "block_size=32", "--steps", "4", "--batch-size", "4",
            "--out", str(ckpt), "--no-progress"])
        assert result.exit_code == 0, result.output
        ckpts.append(ckpt)
    out = tmp_path / "training-report"
    page = build_report([*ckpts, llama_run], out=out)
    html = parse(page)
    training = next(rows for attrs, rows in html.tables if attrs.get("class") == "training")
    assert [r[0] for r in training[1:]] == ["ckpt-baseline", "ckpt-sinklogit"]
    assert [r[1] for r in training[1:]] == ["baseline", "sinklogit"]
    log = pd.read_csv(ckpts[1] / "log.csv").dropna(subset=["val_loss"])
    assert float(training[2][-1]) == pytest.approx(log.sort_values("step")["val_loss"].iloc[-1], rel=1e-5)
    assert (out / "figures" / "training_loss.png").is_file()
    assert html.sections == list(SINKS_PROBES)  # the probe run is still reported beside the training
