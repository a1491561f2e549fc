"""The Python API mirrors the CLI: same pipeline, same table, for names, loaded models and bridges."""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from typer.testing import CliRunner

import sinkscope
from sinkscope.cli import app
from sinkscope.errors import SinkscopeError
from tiny_models import build, random_ids
from repo_paths import REPO

README = REPO / "README.md"


def _cli_run(folder, text_file, out, *extra):
    result = CliRunner().invoke(app, ["sinks", str(folder), "--text-file", str(text_file), "--seq-len", "24",
                                      "--n-seqs", "5", "--out", str(out), "--no-progress", "--no-figures", *extra])
    assert result.exit_code == 0, result.output
    return pd.read_csv(out / "results.csv"), np.load(out / "tokens.npy")


def test_measure_by_path_equals_the_cli(tiny_llama_dir, text_file, tmp_path):
    cli_table, cli_tokens = _cli_run(tiny_llama_dir, text_file, tmp_path / "cli")
    result = sinkscope.measure("sinks", str(tiny_llama_dir), text_file=str(text_file), seq_len=24, n_seqs=5)
    assert np.array_equal(result.tokens, cli_tokens)
    assert result.manifest["command"] == "sinks" and result.path is None  # nothing written
    saved = result.save(tmp_path / "api", figures=False)
    pd.testing.assert_frame_equal(pd.read_csv(saved / "results.csv"), cli_table)


def test_measure_a_loaded_model_with_texts_and_windows(tiny_llama_dir, text_file, tokenizer, tmp_path):
    cli_table, cli_tokens = _cli_run(tiny_llama_dir, text_file, tmp_path / "cli")
    model = build("llama")
    texts = [Path(text_file).read_text(encoding="utf-8")]
    by_texts = sinkscope.measure("sinks", model, tokenizer, texts=texts, seq_len=24, n_seqs=5)
    assert np.array_equal(by_texts.tokens, cli_tokens)
    np.testing.assert_allclose(by_texts.table["value"], cli_table["value"], rtol=1e-6, atol=1e-7)
    by_windows = sinkscope.measure("sinks", model, windows=cli_tokens)
    pd.testing.assert_frame_equal(by_windows.table, by_texts.table)
    assert by_windows.manifest["windows"]["rule"] == "token ids given by the caller"
    page = by_windows.report(tmp_path / "run")
    assert page == tmp_path / "run" / "report.html" and page.is_file()
    assert (tmp_path / "run" / "results.parquet").is_file()


def test_measure_named_probes_with_parameters():
    model = build("gpt_oss")
    ids = random_ids(3, 20).numpy()
    result = sinkscope.measure(["sink_rate", "phantom_mass"], model, windows=ids,
                               params={"sink_rate": {"epsilon": 0.05, "layer_start": 1}})
    assert set(result.table.probe) == {"sink_rate", "phantom_mass"}
    assert result.table.loc[result.table.metric == "sink_rate_from_layer", "layer_start"].tolist() == [1]
    assert result.manifest["probes"]["sink_rate"]["options"]["epsilon"] == 0.05


def test_a_repeatable_option_takes_one_value_or_a_list():
    """subtract_head="0.1" is one head, not the characters '0', '.', '1' (the CLI's --subtract-head once)."""
    model = build("llama")
    ids = random_ids(2, 12).numpy()
    one = sinkscope.measure("circuit", model, windows=ids, subtract_head="0.1", bos_experiments=False)
    listed = sinkscope.measure("circuit", model, windows=ids, subtract_head=["0.1"], bos_experiments=False)
    assert list(one.manifest["options"]["subtract_head"]) == list(listed.manifest["options"]["subtract_head"]) == ["0.1"]
    pd.testing.assert_frame_equal(one.table, listed.table)


def test_api_mistakes_are_one_sentence():
    model = build("llama")
    with pytest.raises(SinkscopeError, match="did you mean 'seq_len'"):
        sinkscope.measure("sinks", model, windows=random_ids(2, 8).numpy(), seqlen=8)
    with pytest.raises(SinkscopeError, match="did you mean 'p0_mass'"):
        sinkscope.measure("p0_mas", model, windows=random_ids(2, 8).numpy())
    with pytest.raises(SinkscopeError, match="need a tokenizer"):
        sinkscope.measure("sinks", model, texts=["some text"])


def test_a_transformer_lens_bridge_is_measured_through_the_model_it_wraps(tmp_path, tokenizer):
    """The bridge re-implements attention; sinkscope puts the HF modules back for the run."""
    bridge_module = pytest.importorskip("transformer_lens.model_bridge")
    from transformers import AutoTokenizer

    tokenizer.save_pretrained(tmp_path)
    loaded_tokenizer = AutoTokenizer.from_pretrained(tmp_path)  # the bridge needs one read from a folder
    ids = random_ids(3, 24).numpy()
    for family, architecture in [("llama", "LlamaForCausalLM"), ("gpt_oss", "GptOssForCausalLM")]:
        hf = build(family)
        hf.config.architectures = [architecture]
        bridge = bridge_module.TransformerBridge.boot_transformers(str(tmp_path), hf_model=hf,
                                                                   tokenizer=loaded_tokenizer)
        before = type(hf.model.layers[0]).__name__
        through_bridge = sinkscope.measure("sinks", bridge, windows=ids)
        direct = sinkscope.measure("sinks", build(family), windows=ids)
        pd.testing.assert_frame_equal(through_bridge.table, direct.table)
        assert type(hf.model.layers[0]).__name__ == before == "BlockBridge"  # the bridge is left as it was
        assert through_bridge.manifest["model"]["source"]["kind"] == "object"


@pytest.mark.slow  # loads the real SmolLM2
def test_the_readme_example_runs(tmp_path, monkeypatch):
    """The notebook example in the README, as written (the bundled SmolLM2 and corpus)."""
    text = README.read_text(encoding="utf-8")
    match = re.search(r"<!-- api-example -->\s*```python\n(.*?)```", text, re.S)
    assert match, "the README lost its API example"
    monkeypatch.chdir(tmp_path)
    namespace: dict = {}
    exec(compile(match.group(1), "README.md", "exec"), namespace)  # noqa: S102 - our own README
    result = namespace["result"]
    assert set(result.table.probe) >= {"p0_mass", "sink_rate"}
    assert (tmp_path / "runs" / "smollm2" / "report.html").is_file()


def test_a_report_that_fails_to_draw_costs_the_report_never_the_results(tiny_llama_dir, text_file, tmp_path,
                                                                       monkeypatch, capsys):
    import sinkscope.report as report

    def broken(*args, **kwargs):
        raise TypeError("a drawing bug")

    monkeypatch.setattr(report, "build_report", broken)
    out = tmp_path / "run"
    result = CliRunner().invoke(app, ["sinks", str(tiny_llama_dir), "--text-file", str(text_file), "--seq-len", "16",
                                      "--n-seqs", "2", "--out", str(out), "--no-progress"])
    assert result.exit_code == 0, result.output
    assert "the report could not be drawn (TypeError: a drawing bug)" in result.output
    assert (out / "results.csv").is_file() and (out / "manifest.json").is_file() and (out / "tokens.npy").is_file()
    assert not (out / "report.html").exists()
    monkeypatch.undo()
    redraw = CliRunner().invoke(app, ["report", str(out)])
    assert redraw.exit_code == 0, redraw.output
    assert (out / "report.html").is_file()
