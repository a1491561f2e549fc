"""The probe platform: a probe in one file through the CLI, passes and interventions, merging,
loading in the requested dtype, the soft-capped mask, the Python API."""

from __future__ import annotations

import json
import textwrap

import numpy as np
import pandas as pd
import pytest
import torch
import torch.nn.functional as F
from typer.testing import CliRunner

from sinkscope.capture import hooks as hp, ModelSpec
from sinkscope.cli import app
from sinkscope.commands.sinks import sinks_probes
from sinkscope.probes import get_probe, HeadMeans, Probe, intervenes, observes, register_probe
from sinkscope.store.results import MetricInfo, Row, rows_to_frame
from sinkscope.forward.runner import run_probes
from repo_paths import REPO
from tiny_models import build, random_ids

runner = CliRunner()

PLUGIN = '''
"""A probe in a single file: the decorator and hook-point names, nothing else."""
from sinkscope.capture import hooks
from sinkscope.probes import Probe, observes, register_probe
from sinkscope.store.results import MetricInfo, Row


@register_probe("plugin_loss", metrics={
    "mean_loss": MetricInfo("Mean next-token loss", "nats", "mean over windows and positions of the loss", "test"),
    "bos_share": MetricInfo("Share of id 0", "share", "share of token ids equal to 0", "test", per="model"),
})
class PluginLoss(Probe):
    def setup(self):
        self.loss_sum, self.loss_n, self.zeros, self.n = 0.0, 0, 0, 0

    @observes(hooks.LOSS)
    def loss(self, layer, value):
        self.loss_sum += float(value.double().sum())
        self.loss_n += value.numel()

    @observes(hooks.TOKENS)
    def tokens(self, layer, ids):
        self.zeros += int((ids == 0).sum())
        self.n += ids.numel()

    def rows(self):
        return [Row(self.name, "mean_loss", None, None, self.loss_sum / self.loss_n, self.loss_n),
                Row(self.name, "bos_share", None, None, self.zeros / self.n, self.n)]
'''


def test_a_probe_in_one_file_runs_through_the_cli(tiny_llama_dir, text_file, tmp_path):
    plugin = tmp_path / "my_probes.py"
    plugin.write_text(textwrap.dedent(PLUGIN), encoding="utf-8")
    out = tmp_path / "run"
    result = runner.invoke(app, ["measure", str(tiny_llama_dir), "--plugin", str(plugin), "--probe", "plugin_loss",
                                 "--probe", "p0_mass", "--text-file", str(text_file), "--seq-len", "24", "--n-seqs",
                                 "4", "--batch-size", "3", "--out", str(out), "--no-progress", "--no-figures"])
    assert result.exit_code == 0, result.output
    table = pd.read_csv(out / "results.csv")
    tokens = np.load(out / "tokens.npy")
    model = build("llama")  # the same weights as the saved folder
    with torch.no_grad():
        logits = model(torch.from_numpy(tokens)).logits  # (B, T, V)
    ids = torch.from_numpy(tokens)
    reference = F.cross_entropy(logits[:, :-1].reshape(-1, logits.shape[-1]), ids[:, 1:].reshape(-1))
    mean_loss = table[table.metric == "mean_loss"]["value"].item()
    assert mean_loss == pytest.approx(float(reference), rel=1e-5)
    assert table[table.metric == "bos_share"]["value"].item() == pytest.approx(float((ids == 0).float().mean()))
    assert set(table.probe) == {"plugin_loss", "p0_mass"}
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["command"] == "measure" and manifest["options"]["plugins"] == [str(plugin)]
    listing = runner.invoke(app, ["ls", "probes", "--plugin", str(plugin)])
    assert "plugin_loss" in listing.output and "hook points: loss, tokens" in listing.output


def test_unknown_names_get_a_suggestion(tiny_llama_dir, tmp_path):
    result = runner.invoke(app, ["measure", str(tiny_llama_dir), "--probe", "p0_mas", "--out", str(tmp_path / "x")])
    assert result.exit_code == 1 and "did you mean 'p0_mass'" in result.output
    result = runner.invoke(app, ["measure", str(tiny_llama_dir), "--probe", "sink_rate", "--param",
                                 "sink_rate.epsilom=0.2", "--out", str(tmp_path / "x")])
    assert result.exit_code == 1 and "did you mean 'epsilon'" in result.output
    result = runner.invoke(app, ["measure", str(tiny_llama_dir), "--probe", "sink_rate", "--param",
                                 "sink_rate.epsilon=2", "--out", str(tmp_path / "x")])
    assert result.exit_code == 1 and "must lie in (0, 1)" in result.output
    result = runner.invoke(app, ["ls", "hook"])
    assert result.exit_code == 1 and "did you mean 'hooks'" in result.output


def test_ls_hooks_lists_every_point_with_its_shape():
    result = runner.invoke(app, ["ls", "hooks"])
    assert result.exit_code == 0
    for name, point in hp.HOOK_POINTS.items():
        assert name in result.output and point.shape in result.output
    assert result.output.count("(intervenable)") == len(hp.INTERVENABLE)


@register_probe("test_zero_head_loss", metrics={"loss": MetricInfo("loss", "nats", "mean loss", "test")})
class ZeroHeadLoss(Probe):
    """The mean loss in the clean pass, with head 0 of the last layer zeroed, and an identity pass."""

    def setup(self):
        self.loss = {}

    def passes(self):
        return (None, "identity", "zero")

    @observes(hp.LOSS)
    def on_loss(self, layer, value):
        self.loss[self.pass_label] = self.loss.get(self.pass_label, 0.0) + float(value.double().sum())

    @intervenes(hp.ATTN_Z)
    def ablate(self, layer, z):
        if self.pass_label == "identity":
            return z.clone()
        if self.pass_label == "zero" and layer == self.spec.attention_layers[-1]:
            z = z.clone()
            z[:, :, 0] = 0
            return z
        return None

    def rows(self):
        return [Row(self.name, "loss", None, None, v, 0, (("pass", str(k)),)) for k, v in self.loss.items()]


def test_passes_run_each_batch_under_each_intervention():
    model = build("llama")
    ids = random_ids(3, 16).numpy()
    probe = ZeroHeadLoss(ModelSpec.from_model(model))
    p0 = get_probe("p0_mass")(ModelSpec.from_model(model))
    run_probes(model, ids, [probe, p0], batch_size=2, progress=False)
    with torch.no_grad():
        logits = model(torch.from_numpy(ids)).logits
    t = torch.from_numpy(ids)
    clean = F.cross_entropy(logits[:, :-1].reshape(-1, logits.shape[-1]), t[:, 1:].reshape(-1), reduction="sum")
    assert probe.loss[None] == pytest.approx(float(clean), rel=1e-5)
    assert probe.loss["identity"] == pytest.approx(probe.loss[None], rel=1e-6)
    assert abs(probe.loss["zero"] - probe.loss[None]) > 1e-4
    # the p0 probe saw only the clean pass: it equals a run without the intervening probe
    alone = get_probe("p0_mass")(ModelSpec.from_model(model))
    run_probes(model, ids, [alone], batch_size=2, progress=False)
    pd.testing.assert_frame_equal(rows_to_frame(p0.rows()), rows_to_frame(alone.rows()))
    frame = rows_to_frame(probe.rows())
    assert list(frame.columns) == ["probe", "metric", "layer", "head", "value", "n", "pass", "se"]


@pytest.mark.parametrize("family", ["llama", "gpt_oss"])
def test_one_window_shares_merge_to_the_one_pass_table(family):
    """torchrun with --n-seqs equal to the number of processes: every share holds one window."""
    model = build(family)
    spec = ModelSpec.from_model(model)
    ids = random_ids(3, 20, seed=2).numpy()
    whole = sinks_probes(spec, sink_layer_start=1)
    run_probes(model, ids, whole, batch_size=3, progress=False)
    shares = []
    for i in range(3):
        probes = sinks_probes(spec, sink_layer_start=1)
        run_probes(model, ids[i:i + 1], probes, batch_size=1, progress=False)
        shares.append(probes)
    merged = shares[0]
    for other in shares[1:]:
        for mine, theirs in zip(merged, other):
            mine.merge(theirs)
    one = rows_to_frame(r for p in whole for r in p.rows())
    parts = rows_to_frame(r for p in merged for r in p.rows())
    pd.testing.assert_frame_equal(one.drop(columns="value"), parts.drop(columns="value"))
    np.testing.assert_allclose(parts["value"], one["value"], rtol=1e-6, atol=1e-7)


def test_head_means_set_values_survive_a_merge_but_means_add():
    a, b = HeadMeans(1, 2), HeadMeans(1, 2)
    a.add(0, torch.tensor([[1.0, 3.0]]), item_dims=(0,))  # one item per head: count 1, like set()
    b.add(0, torch.tensor([[5.0, 7.0]]), item_dims=(0,))
    a.merge(b)
    assert a.means()[0].tolist() == [3.0, 5.0] and a.counts[0].tolist() == [2, 2]
    c, d = HeadMeans(1, 2), HeadMeans(1, 2)
    c.set(0, torch.tensor([0.5, 0.25]))
    d.set(0, torch.tensor([0.5, 0.25]))
    c.merge(d)
    assert c.means()[0].tolist() == [0.5, 0.25] and c.counts[0].tolist() == [1, 1]


def test_softcapped_fused_attention_is_causal():
    """With soft-capping the fused function falls back to eager, building the causal mask that
    sdpa_mask leaves implicit (None). No supported family passes ``softcap`` today (Gemma 3 in
    transformers 5.x does not), so the function is called as a Gemma-2-style model would."""
    import sys

    from collect import Collect
    from sinkscope.capture import attention as capture_attention, capture

    model = build("gemma3_text")
    module = model.model.layers[1].self_attn  # a full-attention layer
    eager = sys.modules[type(module).__module__].eager_attention_forward
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(2, n, 20, 16, generator=g) for n in (4, 2, 2))  # (B, H|Hkv, T, D)
    causal = torch.full((20, 20), torch.finfo(torch.float32).min).triu(1).view(1, 1, 20, 20)
    reference, weights = eager(module, q, k, v, causal, scaling=0.25, softcap=2.0)
    collect = Collect()
    with capture(model, collect, mode="fused"):
        out, _ = capture_attention.sinkscope_fused_attention(module, q, k, v, None, scaling=0.25, softcap=2.0)
    torch.testing.assert_close(out, reference, atol=1e-6, rtol=0)
    (record,) = collect.records
    assert record.softcap == 2.0 and torch.all(record.weights.triu(1) == 0)
    torch.testing.assert_close(torch.softmax(record.logits(), -1), record.weights, atol=1e-6, rtol=0)


def test_models_load_in_the_requested_dtype(tiny_llama_dir, monkeypatch):
    """--dtype bfloat16 reads the weights as bfloat16: no float32 copy of the model first."""
    from transformers import AutoModelForCausalLM

    from sinkscope.run.loaders import load_model
    from sinkscope.models.resolve import resolve_source

    asked = []
    real = AutoModelForCausalLM.from_pretrained.__func__

    def spy(cls, *args, **kwargs):
        asked.append(kwargs.get("dtype"))
        return real(cls, *args, **kwargs)

    monkeypatch.setattr(AutoModelForCausalLM, "from_pretrained", classmethod(spy))
    loaded = load_model(resolve_source(str(tiny_llama_dir)), device="cpu", dtype="bfloat16", log=lambda m: None)
    assert asked == [torch.bfloat16]
    assert {p.dtype for p in loaded.model.parameters()} == {torch.bfloat16}


def test_the_readme_probe_example_runs_as_a_plugin(tiny_llama_dir, text_file, tmp_path):
    """The probe written in the README, saved as a file and run with --plugin, equals ||h_p|| by hand."""
    import re

    readme = (REPO / "README.md").read_text(encoding="utf-8")
    code = re.search(r"<!-- probe-example -->\s*```python\n(.*?)```", readme, re.S).group(1)
    plugin = tmp_path / "readme_probe.py"
    plugin.write_text(code, encoding="utf-8")
    out = tmp_path / "run"
    result = runner.invoke(app, ["measure", str(tiny_llama_dir), "--plugin", str(plugin), "--probe", "resid_norm",
                                 "--param", "resid_norm.position=3", "--text-file", str(text_file), "--seq-len",
                                 "16", "--n-seqs", "3", "--out", str(out), "--no-progress", "--no-figures"])
    assert result.exit_code == 0, result.output
    table = pd.read_csv(out / "results.csv")
    model = build("llama")
    with torch.no_grad():
        hidden = model(torch.from_numpy(np.load(out / "tokens.npy")), output_hidden_states=True).hidden_states
    for layer in range(3):
        expected = hidden[layer + 1][:, 3].norm(dim=-1).mean()  # resid_post of layer l = hidden_states[l + 1]
        if layer == 2:
            expected = None  # the last hidden state is after the final norm in transformers
        if expected is not None:
            value = table[(table.layer == layer) & table["head"].notna()]["value"].item()
            assert value == pytest.approx(float(expected), rel=1e-5)
