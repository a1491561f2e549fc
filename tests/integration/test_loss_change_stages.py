"""The two-stage loss change (``probes/loss_change.py``): ``heads --ablate-dormant`` and
``sinks --massive-intervention`` take the clean loss from the first stage's pass and run only the
changed pass in the second, both under sinkscope's attention function (issue 28).

The reference is computed by hand, outside sinkscope's capture: the same tiny Llama run twice with
sinkscope's registered attention function as its implementation (so the same kernel), once clean
and once with the change made by a plain PyTorch hook (the heads' slices of ``o_proj``'s input
zeroed; the residual entries set on the decoder layer's output), the cross-entropy summed in
float64 over the same batches. The run's numbers must equal it exactly, and the model's own eager
loss must not (otherwise the kernel would not be what the test checks).
"""

from __future__ import annotations

import contextlib
import re

import numpy as np
import pytest
import torch
import torch.nn.functional as F

import sinkscope
from sinkscope.forward import runner as runner_module
from sinkscope.capture.attention import implementation_for, register_interfaces
from tiny_models import build, random_ids

N_WINDOWS, SEQ_LEN, BATCH = 5, 24, 2  # batches of 2, 2, 1 windows


@contextlib.contextmanager
def sinkscope_kernel(model):
    """The model runs sinkscope's fused attention function, with no capture attached."""
    previous = model.config._attn_implementation
    register_interfaces()
    model.set_attn_implementation(implementation_for(model, "fused"))
    try:
        yield
    finally:
        model.set_attn_implementation(previous)


def summed_loss(model, ids: np.ndarray) -> tuple[float, int]:
    """Sum of next-token cross-entropy in float64, batch by batch as the runner adds it, and the count."""
    total, count = 0, 0
    with torch.inference_mode():
        for start in range(0, len(ids), BATCH):
            batch = torch.from_numpy(ids[start:start + BATCH])  # (B, T)
            logits = model(input_ids=batch, use_cache=False).logits  # (B, T, V)
            flat = logits[:, :-1].float().reshape(-1, logits.shape[-1])  # (B*(T-1), V)
            total = total + F.cross_entropy(flat, batch[:, 1:].reshape(-1), reduction="none").double().sum()
            count += batch[:, 1:].numel()
    return float(total), count


@contextlib.contextmanager
def heads_zeroed(model, heads: tuple[str, ...]):
    """Zero the listed LAYER.HEAD outputs where they enter ``o_proj`` (B, T, H*D), by plain forward pre-hooks."""
    by_layer: dict[int, list[int]] = {}
    for item in heads:
        layer, head = map(int, item.split("."))
        by_layer.setdefault(layer, []).append(head)
    D = model.config.head_dim if getattr(model.config, "head_dim", None) else \
        model.config.hidden_size // model.config.num_attention_heads

    def zero(listed):
        def hook(_module, args):
            z = args[0].clone()  # (B, T, H*D)
            for head in listed:
                z[..., head * D:(head + 1) * D] = 0
            return (z, *args[1:])
        return hook

    handles = [model.model.layers[layer].self_attn.o_proj.register_forward_pre_hook(zero(listed))
               for layer, listed in by_layer.items()]
    try:
        yield
    finally:
        for handle in handles:
            handle.remove()


@contextlib.contextmanager
def entries_set(model, entries: tuple[str, ...]):
    """Set h[:, POSITION, CHANNEL] = VALUE at LAYER's output, by plain forward hooks on the decoder layers."""
    by_layer: dict[int, list[tuple[int, int, float]]] = {}
    for item in entries:
        layer, position, channel, value = re.match(r"^(\d+):(\d+):(\d+)=(.+)$", item).groups()
        by_layer.setdefault(int(layer), []).append((int(position), int(channel), float(value)))

    def setter(listed):
        def hook(_module, _args, output):
            hidden = (output[0] if isinstance(output, tuple) else output).clone()  # (B, T, C)
            for position, channel, value in listed:
                hidden[:, position, channel] = value
            return (hidden, *output[1:]) if isinstance(output, tuple) else hidden
        return hook

    handles = [model.model.layers[layer].register_forward_hook(setter(listed)) for layer, listed in by_layer.items()]
    try:
        yield
    finally:
        for handle in handles:
            handle.remove()


@pytest.fixture
def forwards(monkeypatch) -> list[tuple[str | None, bool]]:
    """Every forward the runner makes: (pass label, whether a probe of it reads the loss)."""
    made: list[tuple[str | None, bool]] = []
    real = runner_module._forward

    def counted(model_, ids_, dispatcher, **kwargs):
        made.append((dispatcher.label, "loss" in dispatcher.observed))
        return real(model_, ids_, dispatcher, **kwargs)

    monkeypatch.setattr(runner_module, "_forward", counted)
    return made


RUNS = {
    # importances of this model and windows: 0.8781 to 0.8796; 0.879 makes 5 of the 16 heads dormant
    "heads": ({"ablate_dormant": True, "dormant_below": 0.879}, "head_ablation", "ablated", "heads", heads_zeroed,
              ("loss_clean", "loss_ablated", "loss_delta")),
    "sinks": ({"massive_top_k": 5, "massive_min_abs": 0.0, "massive_min_ratio": 2.0, "massive_intervention": "zero"},
              "massive_intervention", "intervened", "entries", entries_set,
              ("massive_loss_clean", "massive_loss_intervened", "massive_loss_delta")),
}


@pytest.mark.parametrize("command", sorted(RUNS))
def test_the_loss_change_is_two_passes_of_one_kernel(command, forwards):
    options, probe, label, listed, change, (clean_metric, changed_metric, delta_metric) = RUNS[command]
    model = build("llama")
    ids = random_ids(N_WINDOWS, SEQ_LEN, seed=3).numpy()  # (5, 24)
    result = sinkscope.measure(command, model, windows=ids, batch_size=BATCH, progress=False, explore_windows=0,
                               **options)  # the explorer's own pass after the measurement is not one of its stages
    # per batch: the first stage's clean pass (reading the loss), then the second stage's changed pass alone
    assert forwards == [(None, True)] * 3 + [(label, True)] * 3
    targets = result.manifest["probes"][probe]["options"][listed]
    assert targets, "the thresholds must select something to change"
    if command == "heads":  # with every head zeroed no attention output is left, and any kernel would pass
        assert len(targets) < model.config.num_hidden_layers * model.config.num_attention_heads

    with sinkscope_kernel(model):
        clean_sum, n = summed_loss(model, ids)
        with change(model, tuple(targets)):
            changed_sum, _ = summed_loss(model, ids)
    own_sum, _ = summed_loss(model, ids)  # the model's own eager attention
    assert own_sum != clean_sum, "the two kernels agree here, so the test cannot tell them apart"

    rows = result.table[result.table.probe == probe]
    value = dict(zip(rows.metric, rows.value))
    assert (rows.n == N_WINDOWS).all()  # the windows (SPEC.md "Tables"); the means are over the n predictions
    assert value[clean_metric] == clean_sum / n
    assert value[changed_metric] == changed_sum / n
    assert value[delta_metric] == changed_sum / n - clean_sum / n
    assert value[delta_metric] != 0.0


def test_no_second_stage_forward_when_nothing_is_dormant(forwards):
    """No dormant head: the second stage has nothing to change and runs no forward; the loss change is 0."""
    model = build("llama")
    ids = random_ids(N_WINDOWS, SEQ_LEN, seed=3).numpy()
    result = sinkscope.measure("heads", model, windows=ids, batch_size=BATCH, progress=False,
                               ablate_dormant=True, dormant_below=1e-9, explore_windows=0)
    assert forwards == [(None, True)] * 3  # the first stage's clean passes, reading the loss
    rows = result.table[result.table.probe == "head_ablation"]
    value = dict(zip(rows.metric, rows.value))
    assert value["ablated_heads"] == 0.0 and value["loss_delta"] == 0.0
    with sinkscope_kernel(model):
        clean_sum, n = summed_loss(model, ids)
    assert value["loss_clean"] == clean_sum / n
