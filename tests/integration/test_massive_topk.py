"""Massive activations as Sun et al. measure them (issue 27, fix 9): the top-k entries per layer and
the zero / mean intervention, each checked against an independent computation.

The reference never uses sinkscope's capture: forward hooks on the decoder layers of a tiny
Hugging Face model read (or set) the layer outputs, numpy finds the distinct top k and the
criterion, and the model's own logits give the loss.
"""

from __future__ import annotations

import json

import numpy as np
import pandas as pd
import pytest
import torch
import torch.nn.functional as F
from typer.testing import CliRunner

from sinkscope.capture import ModelSpec
from sinkscope.capture.families import get_submodule
from sinkscope.cli import app
from sinkscope.probes import get_probe
from sinkscope.store.results import rows_to_frame
from sinkscope.forward.runner import run_probes
from tiny_models import PATHS, build, random_ids

runner = CliRunner()
K, MIN_ABS, MIN_RATIO = 5, 0.12, 5.0  # a random tiny model has no |h| > 100: a criterion some entries meet


def layer_outputs(model, ids: torch.Tensor, family: str = "llama") -> list[np.ndarray]:
    """Each decoder layer's output hidden state (B, T, C), read by forward hooks."""
    layers = get_submodule(model, PATHS[family].layers)
    out, handles = {}, []
    for i, layer in enumerate(layers):
        handles.append(layer.register_forward_hook(
            lambda _m, _i, o, i=i: out.__setitem__(i, (o[0] if isinstance(o, tuple) else o).double().numpy())))
    with torch.no_grad():
        model(ids, use_cache=False)
    for h in handles:
        h.remove()
    return [out[i] for i in range(len(layers))]


def reference_top(h: np.ndarray, ids: np.ndarray, k: int) -> list[tuple]:
    """(|h|, h, position, channel, token, massive) of the k largest distinct (position, channel) entries."""
    B, T, C = h.shape
    mag = np.abs(h)
    medians = np.array([np.median(mag[b].astype(np.float32)) for b in range(B)])
    best = {}
    for b in range(B):
        for t in range(T):
            for c in range(C):
                v = mag[b, t, c]
                if (t, c) not in best or v > best[(t, c)][0]:
                    massive = v > MIN_ABS and v >= MIN_RATIO * medians[b]
                    best[(t, c)] = (v, h[b, t, c], t, c, int(ids[b, t]), massive)
    return sorted(best.values(), key=lambda e: (-e[0], e[2] * C + e[3]))[:k]


def test_the_top_k_entries_are_the_largest_distinct_entries_with_their_token_and_criterion():
    model = build("llama")
    ids = random_ids(4, 12, seed=2)
    ids[:, 0] = 1  # every window starts with the same token: position 0 is the same state in each (one entry)
    spec = ModelSpec.from_model(model)
    probe = get_probe("massive_topk")(spec, top_k=K, min_abs=MIN_ABS, min_ratio=MIN_RATIO)
    run_probes(model, ids.numpy(), [probe], batch_size=3, progress=False)  # batches of 3 and 1 windows
    frame = rows_to_frame(probe.rows())
    hidden = layer_outputs(model, ids)
    n_massive = 0
    for layer, h in enumerate(hidden):
        want = reference_top(h, ids.numpy(), K)
        got = frame[(frame.metric == "massive_topk") & (frame.layer == layer)].sort_values("rank")
        assert len(got) == K
        for (v, signed, t, c, token, massive), row in zip(want, got.itertuples()):
            assert (int(row.position), int(row.channel), int(row.token_id), bool(row.massive)) == (t, c, token, massive)
            assert row.value == pytest.approx(v, rel=1e-5) and row.signed == pytest.approx(signed, rel=1e-5)
            n_massive += massive
        mag = np.abs(h)
        medians = np.median(mag.reshape(len(h), -1).astype(np.float32), axis=1)
        count = ((mag > MIN_ABS) & (mag >= MIN_RATIO * medians[:, None, None])).sum() / len(h)
        assert frame[(frame.metric == "massive_count") & (frame.layer == layer)]["value"].item() == pytest.approx(count)
    assert 0 < n_massive < K * len(hidden)  # the criterion separates some entries from others


@pytest.mark.parametrize("mode", ["zero", "mean"])
def test_the_intervention_equals_an_explicit_hook_setting_the_same_entries(mode, tiny_llama_dir, text_file,
                                                                           tmp_path):
    """sinks --massive-intervention: the loss of the intervened pass equals the model's own loss with a
    forward hook that sets h[:, t, c] at the output of layer l to 0 (or to its mean over the windows,
    computed here from hooks) for every massive top-k entry at the first layer where it is massive."""
    out = tmp_path / "run"
    result = runner.invoke(app, ["sinks", str(tiny_llama_dir), "--text-file", str(text_file), "--seq-len", "16",
                                 "--n-seqs", "4", "--massive-top-k", str(K), "--massive-min-abs", str(MIN_ABS),
                                 "--massive-min-ratio", str(MIN_RATIO), "--massive-intervention", mode,
                                 "--out", str(out), "--no-figures", "--no-progress"])
    assert result.exit_code == 0, result.output
    table = pd.read_csv(out / "results.csv")
    ids = torch.from_numpy(np.load(out / "tokens.npy"))
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(tiny_llama_dir).eval()
    hidden = layer_outputs(model, ids)
    top = table[table.metric == "massive_topk"]
    first: dict[tuple[int, int], int] = {}
    for row in top.sort_values(["layer", "rank"]).itertuples():
        if row.massive == 1:
            first.setdefault((int(row.position), int(row.channel)), int(row.layer))
    assert first, "no entry met the criterion"
    targets = {}
    for (t, c), layer in first.items():
        targets.setdefault(layer, []).append((t, c, 0.0 if mode == "zero" else float(hidden[layer][:, t, c].mean())))
    manifest = json.loads((out / "manifest.json").read_text())
    entries = manifest["probes"]["massive_intervention"]["options"]["entries"]
    assert len(entries) == sum(len(v) for v in targets.values())

    def loss(with_hook: bool) -> float:
        layers, handles = get_submodule(model, PATHS["llama"].layers), []
        if with_hook:
            for layer, items in targets.items():
                def hook(_m, _i, o, items=items):
                    h = (o[0] if isinstance(o, tuple) else o).clone()
                    for t, c, value in items:
                        h[:, t, c] = value
                    return (h, *o[1:]) if isinstance(o, tuple) else h
                handles.append(layers[layer].register_forward_hook(hook))
        with torch.no_grad():
            logits = model(ids, use_cache=False).logits.double()
        for h in handles:
            h.remove()
        return float(F.cross_entropy(logits[:, :-1].reshape(-1, logits.shape[-1]), ids[:, 1:].reshape(-1)))

    value = dict(zip(table.metric, table.value))
    clean, changed = loss(False), loss(True)
    assert abs(changed - clean) > 1e-4  # the intervention does something
    assert value["massive_loss_clean"] == pytest.approx(clean, abs=1e-5)
    assert value["massive_loss_intervened"] == pytest.approx(changed, abs=1e-5)
    assert value["massive_loss_delta"] == pytest.approx(changed - clean, abs=1e-5)
    assert value["massive_ppl_intervened"] == pytest.approx(np.exp(changed), rel=1e-5)


def test_a_plain_sinks_run_has_no_top_k_rows(tiny_llama_dir, text_file, tmp_path):
    out = tmp_path / "plain"
    result = runner.invoke(app, ["sinks", str(tiny_llama_dir), "--text-file", str(text_file), "--seq-len", "16",
                                 "--n-seqs", "2", "--out", str(out), "--no-figures", "--no-progress"])
    assert result.exit_code == 0, result.output
    assert not pd.read_csv(out / "results.csv").metric.str.startswith("massive_topk").any()
