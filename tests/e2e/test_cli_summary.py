"""What a measuring command prints (issue 61, "Numbers in the terminal" and "Comparisons that compare"):
its headline table, then the folder it wrote as the last line; ``--json`` the summary alone; several
models a row per run and the differences, ``compare.csv`` and the page's differences table."""

from __future__ import annotations

import json
import re

import pandas as pd
import pytest
from typer.testing import CliRunner

from sinkscope.cli import app
from tiny_models import build

runner = CliRunner()


def _sinks(model, text_file, out, *extra):
    return runner.invoke(app, ["sinks", str(model), "--text-file", str(text_file), "--seq-len", "16", "--n-seqs", "3",
                               "--no-progress", "--no-figures", "--out", str(out), *extra])


def test_a_run_prints_its_headline_then_its_folder(tiny_llama_dir, text_file, tmp_path):
    out = tmp_path / "run"
    result = _sinks(tiny_llama_dir, text_file, out)
    assert result.exit_code == 0, result.output
    lines = result.stdout.strip().splitlines()
    assert lines[-1] == str(out)  # scripts read the folder off the last line
    assert lines[0].startswith("sinks · ") and "3 windows of 16 tokens" in lines[0]
    p0 = next(line for line in lines if line.split()[:1] == ["p0_mass"])
    table = pd.read_csv(out / "results.csv")
    value = table[(table.metric == "p0_mass") & table.layer.isna()]["value"].iloc[0]
    assert float(p0.split()[1]) == pytest.approx(value, rel=1e-3)
    assert any(re.match(r"\s+\d+\.\d+\s+\S+ ± \S+", line) for line in lines)  # a top head with its se


@pytest.mark.slow
def test_json_prints_the_summary_alone(tiny_llama_dir, text_file, tmp_path):
    result = _sinks(tiny_llama_dir, text_file, tmp_path / "run", "--json")
    assert result.exit_code == 0, result.output
    summary = json.loads(result.stdout)  # the JSON alone on stdout: no table, no folder line
    assert summary["path"] == str(tmp_path / "run") and summary["metrics"][0]["metric"] == "p0_mass"


@pytest.fixture(scope="module")
def second_llama_dir(tmp_path_factory, tokenizer):
    """Another tiny Llama (other weights, the same tokenizer: the same windows)."""
    folder = tmp_path_factory.mktemp("tiny-llama-2")
    build("llama", seed=1).save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return folder


@pytest.mark.slow
def test_a_comparison_prints_and_writes_its_differences(tiny_llama_dir, second_llama_dir, text_file, tmp_path):
    out = tmp_path / "cmp"
    result = runner.invoke(app, ["stream", str(tiny_llama_dir), str(second_llama_dir), "--text-file", str(text_file),
                                 "--length", "48", "--n-seqs", "2", "--cache", "8", "--chunk", "16",
                                 "--policy", "full,window", "--no-progress", "--out", str(out)])
    assert result.exit_code == 0, result.output
    lines = result.stdout.strip().splitlines()
    assert lines[-1] == str(out / "report.html")
    assert lines[0] == "stream · 2 runs" and any(line.startswith("  difference from ") for line in lines)
    assert "  se paired over 2 windows: stream_ppl (policy=full" in result.stdout

    frame = pd.read_csv(out / "compare.csv")
    ppl = frame[(frame.metric == "stream_ppl") & frame.position_bucket.isna()]
    assert set(ppl.pairing) == {"paired"} and (ppl.n_windows == 2).all() and (ppl.se > 0).all()
    assert "compare.csv" in json.loads((out / ".sinkscope-files").read_text())["files"]
    page = (out / "report.html").read_text()
    assert f'<h2 id="differences">Differences from {tiny_llama_dir.name}</h2>' in page
    assert "paired over 2 windows" in page and "did not measure the same token windows" not in page
