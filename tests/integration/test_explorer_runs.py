"""The explorer through the pipeline: a measurement keeps a few heads' patterns, equal to eager attention.

Checked: a ``sinks`` run's ``explorer.npz`` holds, for the first ``explore_windows`` windows of
tokens.npy, the weights Hugging Face's eager attention returns on those ids (within the stored
precision: 1e-3 below the threshold, half a code above it), the value norms of the model's own
value projection and, on gpt-oss, the phantom mass 1 - sum_j a_qj; the manifest's ``explorer``
record; ``none``/0 keep nothing and change no number; a small budget leaves patterns out and says
so; a head the model lacks is one sentence before the run; ``explore`` measures the text itself
as one window; ``Result.show()`` outside a notebook writes the page to a file.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from typer.testing import CliRunner

import sinkscope
from sinkscope.errors import SinkscopeError
from sinkscope.store.explorer_format import SCALE, THRESHOLD, choose_heads
from sinkscope.run.result import Result
from tiny_models import build, random_ids

quiet = {"progress": False, "log": lambda message: None}


def eager_attentions(model, ids: np.ndarray) -> list[np.ndarray]:
    """Hugging Face's eager attention weights on ``ids``: per layer (B, H, T, T) float64."""
    previous = model.config._attn_implementation
    model.config._attn_implementation = "eager"
    try:
        with torch.no_grad():
            out = model(torch.as_tensor(ids), output_attentions=True)
    finally:
        model.config._attn_implementation = previous
    return [a.double().numpy() for a in out.attentions]


def value_norms(model, ids: np.ndarray) -> dict[int, np.ndarray]:
    """||v_j|| per layer from the value projection's own output, (B, Hkv, T): an independent path."""
    found, handles = {}, []
    for l, layer in enumerate(model.model.layers):
        def keep(module, inputs, output, l=l):
            B, T, _ = output.shape
            found[l] = output.reshape(B, T, -1, model.config.head_dim).norm(dim=-1).transpose(1, 2).double().numpy()
        handles.append(layer.self_attn.v_proj.register_forward_hook(keep))
    try:
        with torch.no_grad():
            model(torch.as_tensor(ids))
    finally:
        for handle in handles:
            handle.remove()
    return found


def assert_patterns_equal_eager(result: Result, model, windows: int) -> None:
    data = result.explorer
    ids = result.tokens[:windows]
    reference = eager_attentions(model, ids)
    norms = value_norms(model, ids) if hasattr(model.model.layers[0].self_attn, "v_proj") else None
    groups = model.config.num_attention_heads // model.config.num_key_value_heads
    assert list(data.windows) == list(range(windows))
    for w, window in enumerate(data.windows):
        for k, (layer, head) in enumerate(data.heads):
            a = reference[layer][window, head]  # (T, T)
            got = data.dense(int(window), int(layer), int(head))
            assert np.abs(got - a).max() < THRESHOLD
            stored = got > 0
            assert np.abs(got[stored] - a[stored]).max() <= SCALE / 2 + 2e-6
            np.testing.assert_allclose(data.phantom[w, k], 1 - a.sum(-1), atol=2e-6)
            if norms is not None:
                np.testing.assert_allclose(data.value_norms[w, k], norms[layer][window, head // groups], rtol=2e-5)


@pytest.mark.parametrize("attention", ["fused", "explicit"])
def test_a_sinks_run_keeps_the_patterns_eager_attention_returns(tiny_llama_dir, tmp_path, attention):
    from transformers import AutoModelForCausalLM

    windows = random_ids(4, 24, seed=3)
    out = tmp_path / "run"
    sinkscope.measure("sinks", str(tiny_llama_dir), windows=windows, out=str(out), figures=False,
                      attention=attention, **quiet)
    result = Result.load(out)
    data = result.explorer
    assert (out / "explorer.npz").is_file()
    model = AutoModelForCausalLM.from_pretrained(tiny_llama_dir).eval()
    assert_patterns_equal_eager(result, model, windows=2)
    record = result.manifest["explorer"]
    assert record["windows"] == [0, 1] and record["patterns_left_out"] == 0
    assert record["heads"] == data.heads.tolist() and record["page_bytes"] > 0
    assert set(record["chosen"]) == {"top", "sample"}  # 3 layers x 4 heads: 8 top + 4 sampled
    assert not data.has_phantom and data.has_value_norms
    p0 = result.table[(result.table.metric == "p0_mass") & result.table["head"].notna()]
    assert len(p0) == 12  # the measurement's own rows are all there
    # issue 56, item 2: the patterns were kept in the measuring forward, the heads ranked there by the position-0
    # mass of the explorer's windows: the heads choose_heads picks from that p0 (the old second pass's rule)
    assert record["ranked_by"] == "position-0 mass on the explorer's windows"
    chosen = {tuple(h): c for h, c in zip(record["heads"], record["chosen"])}
    assert chosen == choose_heads(data.p0.astype(np.float64), 0) and list(chosen) == list(choose_heads(data.p0, 0))


def test_a_command_without_p0_ranks_on_the_explorers_windows_in_the_measuring_pass(monkeypatch):
    """No forward pass runs for the explorer alone: run_probes is called once, with the explorer's probe beside the
    command's, and a batch of 1 window ranks the heads on the first window, then keeps the final set's patterns."""
    from sinkscope.forward import runner
    from sinkscope.run import measuring

    calls = []
    original = runner.run_probes

    def counted(model, tokens, probes, **kwargs):
        calls.append([p.name for p in probes])
        return original(model, tokens, probes, **kwargs)

    monkeypatch.setattr(runner, "run_probes", counted)
    monkeypatch.setattr(measuring, "run_probes", counted)
    model = build("llama")
    result = sinkscope.measure("value_norm_ratio", model, windows=random_ids(3, 16, seed=8), batch_size=1, **quiet)
    assert len(calls) == 1 and calls[0][-1] == "explorer"
    record = result.manifest["explorer"]
    assert record["ranked_by"] == "position-0 mass on the explorer's windows" and record["windows"] == [0, 1]
    assert_patterns_equal_eager(result, model, windows=2)
    p0 = result.explorer.p0
    tops = [tuple(h) for h, c in zip(record["heads"], record["chosen"]) if c == "top"]
    assert [p0[t] for t in tops] == sorted((p0[t] for t in tops), reverse=True)


def test_gpt_oss_phantom_and_sliding_window(tmp_path):
    model = build("gpt_oss")
    windows = random_ids(2, 20, seed=4)
    result = sinkscope.measure("sinks", model, windows=windows, explore_heads="all", explore_windows=2, **quiet)
    assert result.explorer.has_phantom
    assert result.explorer.phantom.max() > 0.01
    assert_patterns_equal_eager(result, model, windows=2)


def test_none_keeps_nothing_and_changes_no_number():
    model = build("llama")
    windows = random_ids(2, 16, seed=5)
    with_explorer = sinkscope.measure("sinks", model, windows=windows, **quiet)
    for options in ({"explore_heads": "none"}, {"explore_windows": 0}):
        without = sinkscope.measure("sinks", model, windows=windows, **options, **quiet)
        assert without.explorer is None and "explorer" not in without.manifest
        np.testing.assert_array_equal(without.table["value"].to_numpy(), with_explorer.table["value"].to_numpy())


def test_a_small_budget_leaves_patterns_out_and_says_so():
    model = build("llama")
    said = []
    result = sinkscope.measure("sinks", model, windows=random_ids(2, 40, seed=6), explore_max_mb=0.012,
                               progress=False, log=said.append)
    record = result.manifest["explorer"]
    assert record["patterns_left_out"] > 0 and record["page_bytes"] <= 12_000
    assert len(record["left_out"]) == record["patterns_left_out"]
    assert result.explorer.kept()[0] == (0, 0)  # window 0's top head is kept first
    assert any("the explorer keeps" in line and "--explore-max-mb" in line for line in said)


def test_a_head_the_model_lacks_is_one_sentence_before_the_run():
    said = []
    with pytest.raises(SinkscopeError, match="names layer 7 head 0, which the model does not have"):
        sinkscope.measure("sinks", build("llama"), windows=random_ids(1, 8), explore_heads="7.0", progress=False,
                          log=said.append)
    assert not any(line.startswith("Running") for line in said)


def test_explore_measures_the_text_itself(tiny_llama_dir, tmp_path, tokenizer):
    from sinkscope.cli import app

    text = "the cat sat on the mat and the dog sat on the log"
    out = tmp_path / "explore"
    result = CliRunner().invoke(app, ["explore", str(tiny_llama_dir), "--text", text, "--out", str(out),
                                      "--no-figures", "--no-progress", "--bos", "add"])
    assert result.exit_code == 0, result.output
    run = Result.load(out)
    ids = tokenizer(text, add_special_tokens=False)["input_ids"]
    assert run.tokens.tolist() == [[tokenizer.bos_token_id, *ids]]
    assert run.manifest["command"] == "explore" and run.manifest["explorer"]["windows"] == [0]
    assert list(run.explorer.labels[0][1:]) == [tokenizer.decode([i]) for i in ids]
    assert {"p0_mass", "value_norm_ratio"} <= set(run.table.metric)


@pytest.mark.parametrize("args, words", [
    ([], "give the text to explore with --text"),
    (["--text", "x", "--text-file", "t.txt"], "not both"),
    (["--text", ""], "the text is 0 tokens long"),
])
def test_explore_mistakes_are_one_sentence(tiny_llama_dir, tmp_path, args, words):
    from sinkscope.cli import app

    (tmp_path / "t.txt").write_text("hello there")
    result = CliRunner().invoke(app, ["explore", str(tiny_llama_dir), *[a if a != "t.txt" else str(tmp_path / a)
                                                                        for a in args],
                                      "--out", str(tmp_path / "o"), "--no-progress", "--bos", "none"])
    assert result.exit_code == 1 and words in result.output, result.output
    assert "Traceback" not in result.output


def test_show_outside_a_notebook_writes_the_page(tmp_path, monkeypatch):
    monkeypatch.setenv("TMPDIR", str(tmp_path))
    import tempfile

    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    result = sinkscope.measure("sinks", build("llama"), windows=random_ids(1, 12, seed=2), **quiet)
    page = result.show()
    text = page.read_text(encoding="utf-8")
    assert page.parent == tmp_path and "data-sinkscope-explorer" in text and "sinkscopeExplorer" in text
    with pytest.raises(SinkscopeError, match="holds no attention patterns"):
        sinkscope.measure("sinks", build("llama"), windows=random_ids(1, 12), explore_windows=0, **quiet).show()


def test_show_in_a_notebook_displays_the_page_in_a_frame(monkeypatch):
    from IPython.core.interactiveshell import InteractiveShell
    import IPython.display

    shown = []
    InteractiveShell.instance()
    monkeypatch.setattr(IPython.display, "display", lambda obj: shown.append(obj))
    try:
        result = sinkscope.measure("sinks", build("llama"), windows=random_ids(1, 12, seed=2), **quiet)
        assert result.show(height=700) is None
    finally:
        InteractiveShell.clear_instance()
    (frame,) = shown
    html = frame.data
    assert html.startswith("<iframe srcdoc=") and "height:700px" in html and 'sandbox="allow-scripts"' in html
    assert html.startswith('<iframe srcdoc="&lt;!DOCTYPE html&gt;') and "data-sinkscope-explorer" in html


def test_a_run_that_cannot_carry_the_explorer_says_why_and_reads_its_windows_after(monkeypatch):
    """A resumed run (its first windows measured by an earlier process) or several processes: one line says why a
    pass of its own runs, and that pass keeps the same patterns (auto ranked by the run's p0_mass)."""
    from types import SimpleNamespace

    from sinkscope.run import measuring, stages

    options = SimpleNamespace(resume=True)
    prepared = SimpleNamespace(command=SimpleNamespace(read_windows=None), options=options, world_size=1)
    assert measuring.explorer_rider(prepared, None) == (
        None, "the run was resumed, so an earlier process measured its first windows")
    options.resume, prepared.world_size = False, 2
    assert measuring.explorer_rider(prepared, None) == (None, "the windows were measured by 2 processes")
    prepared.command.read_windows = object()  # stream: no explorer, nothing to say
    assert measuring.explorer_rider(prepared, None) == (None, None)

    monkeypatch.setattr(stages, "explorer_rider", lambda prepared, loaded: (None, "the windows were measured by 2 "
                                                                                   "processes"))
    said = []
    model = build("llama")
    result = sinkscope.measure("sinks", model, windows=random_ids(3, 16, seed=2), progress=False, log=said.append)
    assert "The explorer reads its windows in a pass of their own: the windows were measured by 2 processes." in said
    assert result.manifest["explorer"]["ranked_by"] == "the run's p0_mass"
    assert_patterns_equal_eager(result, model, windows=2)
