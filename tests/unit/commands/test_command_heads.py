"""``sinkscope heads`` as declared in ``sinkscope.commands.heads``, called directly (no CLI).

Checked: the options dataclass and its registration; the probe list for given options (and that
the head_importance probe accepts those parameters); every kind of option mistake, caught by the
cheap check, the config-file check and the loaded-model check, as one sentence naming the option;
and the second stage (``followup``): the dormant heads it ablates are those an independent
computation of the implicit gate (the model's own eager attention weights) puts below
``--dormant-below``, and the clean loss it hands over is the model's mean next-token loss.
"""

from __future__ import annotations

import dataclasses
import json
import math
import re
from types import SimpleNamespace

import pytest
import torch
import torch.nn.functional as F

from sinkscope.commands import get_command
from sinkscope.commands import heads as heads_cmd
from sinkscope.errors import SinkscopeError
from sinkscope.commands.spec import RunOptions
from sinkscope.models.resolve import Source


def assert_one_sentence(message: str, *words: str) -> None:
    """One line, one sentence (no full stop followed by a new capitalised sentence), naming ``words``."""
    assert "\n" not in message and message.endswith("."), message
    assert not re.search(r"[.!?]\s+[A-Z]", message), message
    for word in words:
        assert word in message, message


@pytest.fixture(scope="module", autouse=True)
def _registry():
    """The probe registry, imported once here (it imports torch) rather than inside the first test."""
    from sinkscope.probes import discover

    discover()


# ---- the declaration ------------------------------------------------------------------------------------------


def test_heads_is_registered_with_its_options_and_checks():
    command = get_command("heads")
    assert command is heads_cmd.HEADS
    assert command.options is heads_cmd.HeadsOptions and issubclass(command.options, RunOptions)
    assert command.followup is not None and command.read_windows is None and not command.reads_past_context
    defaults = heads_cmd.HeadsOptions()
    assert defaults.sink_set == "auto" and defaults.dormant_below == heads_cmd.DEFAULT_DORMANT_BELOW
    assert defaults.ablate_dormant is False
    assert {f.name for f in dataclasses.fields(RunOptions)} < {f.name for f in dataclasses.fields(defaults)}


def test_the_probe_list_follows_the_options():
    spec = SimpleNamespace(has_phantom=False)
    plain = heads_cmd.HEADS.probes(heads_cmd.HeadsOptions(dormant_below=0.25), spec)
    assert plain == [("head_importance", {"sink_set": "auto", "dormant_below": 0.25})]

    data = heads_cmd.HEADS.probes(heads_cmd.HeadsOptions(sink_set="data", sink_attention=0.4,
                                                         sink_value_ratio=0.7, sink_min_queries=8), spec)
    assert data == [("head_importance", {"sink_set": "data", "dormant_below": heads_cmd.DEFAULT_DORMANT_BELOW,
                                         "sink_attention": 0.4, "sink_value_ratio": 0.7, "sink_min_queries": 8})]

    # the data thresholds are only passed for the data sink set; the clean loss only with the ablation
    ablate = heads_cmd.HEADS.probes(heads_cmd.HeadsOptions(sink_set="first", sink_attention=0.4,
                                                           ablate_dormant=True), spec)
    assert ablate == [("head_importance", {"sink_set": "first", "dormant_below": heads_cmd.DEFAULT_DORMANT_BELOW,
                                           "clean_loss": True})]


@pytest.mark.parametrize("sink_set", heads_cmd.SINK_SET_CHOICES)
def test_every_sink_set_is_accepted_and_its_parameters_fit_the_probe(sink_set):
    from sinkscope.probes import get_probe

    options = heads_cmd.HeadsOptions(sink_set=sink_set, ablate_dormant=True)
    heads_cmd.HEADS.check(options)
    ((name, params),) = heads_cmd.HEADS.probes(options, SimpleNamespace(has_phantom=True))
    resolved = get_probe(name).resolve_params(params)  # the probe knows every parameter the command passes
    assert {key: resolved[key] for key in params} == params


# ---- mistakes -------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("field, value, option", [
    ("sink_set", "last", "--sink-set"),
    ("sink_set", "First", "--sink-set"),
    ("dormant_below", 1.5, "--dormant-below"),
    ("dormant_below", -0.1, "--dormant-below"),
    ("dormant_below", math.nan, "--dormant-below"),
    ("sink_attention", 1.01, "--sink-attention"),
    ("sink_attention", -0.5, "--sink-attention"),
    ("sink_value_ratio", 0.0, "--sink-value-ratio"),
    ("sink_value_ratio", -1.0, "--sink-value-ratio"),
    ("sink_value_ratio", math.nan, "--sink-value-ratio"),
])
def test_an_option_mistake_is_one_sentence_naming_the_option(field, value, option):
    with pytest.raises(SinkscopeError) as caught:
        heads_cmd.HEADS.check(heads_cmd.HeadsOptions(**{field: value}))
    assert_one_sentence(str(caught.value), option)


@pytest.mark.parametrize("value", [0.0, 1.0])
def test_the_dormancy_bounds_themselves_are_allowed(value):
    heads_cmd.HEADS.check(heads_cmd.HeadsOptions(dormant_below=value, sink_attention=value))


def _folder_source(tmp_path, config: dict | None) -> Source:
    if config is not None:
        (tmp_path / "config.json").write_text(json.dumps(config), encoding="utf-8")
    return Source("folder", str(tmp_path), str(tmp_path))


@pytest.mark.parametrize("sink_set", ["phantom", "first+phantom"])
def test_a_phantom_sink_set_on_a_config_without_a_phantom_fails_before_loading(tmp_path, sink_set):
    source = _folder_source(tmp_path, {"model_type": "llama"})
    with pytest.raises(SinkscopeError) as caught:
        heads_cmd.HEADS.check_source(heads_cmd.HeadsOptions(sink_set=sink_set), source)
    assert_one_sentence(str(caught.value), f"--sink-set {sink_set}")


def test_the_config_check_passes_where_the_phantom_exists_or_cannot_be_told(tmp_path):
    phantom = heads_cmd.HeadsOptions(sink_set="phantom")
    for name in ("gpt_oss", "llama", "empty"):
        (tmp_path / name).mkdir()
    heads_cmd.HEADS.check_source(phantom, _folder_source(tmp_path / "gpt_oss", {"model_type": "gpt_oss"}))
    heads_cmd.HEADS.check_source(phantom, Source("hub", "someone/model", None))  # no config on disk: checked later
    heads_cmd.HEADS.check_source(phantom, _folder_source(tmp_path / "empty", None))  # a folder without config yet
    heads_cmd.HEADS.check_source(heads_cmd.HeadsOptions(sink_set="first"),
                                 _folder_source(tmp_path / "llama", {"model_type": "llama"}))


def test_the_loaded_model_check_refuses_a_phantom_set_without_a_phantom():
    with pytest.raises(SinkscopeError) as caught:
        heads_cmd.HEADS.check_model(heads_cmd.HeadsOptions(sink_set="first+phantom"), SimpleNamespace(has_phantom=False))
    assert_one_sentence(str(caught.value), "--sink-set first+phantom")
    for sink_set in heads_cmd.SINK_SET_CHOICES:
        heads_cmd.HEADS.check_model(heads_cmd.HeadsOptions(sink_set=sink_set), SimpleNamespace(has_phantom=True))
    heads_cmd.HEADS.check_model(heads_cmd.HeadsOptions(sink_set="first"), SimpleNamespace(has_phantom=False))


# ---- the second stage -----------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def llama_and_ids():
    from tiny_models import build, random_ids

    return build("llama"), random_ids(2, 16, seed=3)


def _implicit_gate(model, ids) -> dict[tuple[int, int], float]:
    """Imp^{l,h} = 1 - mean over windows and queries i >= 1 of a_i0, from the model's eager weights."""
    with torch.no_grad():
        attentions = model(ids, output_attentions=True, use_cache=False).attentions
    return {(layer, head): float(value)
            for layer, A in enumerate(attentions)
            for head, value in enumerate(1.0 - A[..., 1:, 0].double().mean(dim=(0, 2)))}


def _first_stage(model, ids, options):
    from sinkscope.capture import ModelSpec
    from sinkscope.probes import get_probe
    from sinkscope.forward.runner import run_probes

    spec = ModelSpec.from_model(model)
    probes = [get_probe(name)(spec, **params) for name, params in heads_cmd.HEADS.probes(options, spec)]
    run_probes(model, ids.numpy(), probes, batch_size=2, progress=False)
    return spec, probes


def test_the_second_stage_ablates_the_heads_an_independent_gate_puts_below_the_threshold(llama_and_ids):
    from sinkscope.probes import get_probe

    model, ids = llama_and_ids
    reference = _implicit_gate(model, ids)
    values = sorted(reference.values())
    gaps = [(values[i + 1] - values[i], i) for i in range(2, len(values) - 3)]
    gap, i = max(gaps)
    assert gap > 1e-4  # a threshold far from every head's importance (fused vs eager differ by ~1e-6)
    threshold = (values[i] + values[i + 1]) / 2
    options = heads_cmd.HeadsOptions(sink_set="first", dormant_below=threshold, ablate_dormant=True)
    spec, probes = _first_stage(model, ids, options)

    ((name, params),) = heads_cmd.HEADS.followup(options, spec, probes)
    assert name == "head_ablation"
    expected = {f"{layer}.{head}" for (layer, head), value in reference.items() if value < threshold}
    assert set(params["heads"]) == expected and len(params["heads"]) == len(expected) == i + 1

    with torch.no_grad():
        logits = model(ids, use_cache=False).logits
    losses = F.cross_entropy(logits[:, :-1].reshape(-1, logits.shape[-1]).double(), ids[:, 1:].reshape(-1),
                             reduction="none")
    assert params["clean_n"] == losses.numel() == ids.shape[0] * (ids.shape[1] - 1)
    assert params["clean_sum"] == pytest.approx(float(losses.sum()), rel=1e-5)
    second = get_probe(name)(spec, **params)  # the second stage's probe takes what the followup hands over
    assert second.heads == params["heads"]


@pytest.mark.parametrize("below, everything", [(0.0, False), (1.0, True)])
def test_the_threshold_bounds_ablate_no_head_or_every_head(llama_and_ids, below, everything):
    """Imp = 1 - a_i0 lies strictly inside (0, 1) for a softmax over key 0 and others."""
    model, ids = llama_and_ids
    options = heads_cmd.HeadsOptions(sink_set="first", dormant_below=below, ablate_dormant=True)
    spec, probes = _first_stage(model, ids, options)
    ((_, params),) = heads_cmd.HEADS.followup(options, spec, probes)
    every = {f"{layer}.{head}" for layer in spec.attention_layers for head in range(spec.n_heads)}
    assert set(params["heads"]) == (every if everything else set())


def test_without_ablate_dormant_there_is_no_second_stage(llama_and_ids):
    model, ids = llama_and_ids
    options = heads_cmd.HeadsOptions(sink_set="first", dormant_below=1.0)
    spec, probes = _first_stage(model, ids, options)
    assert probes[0].dormant_heads()  # there would be heads to ablate
    assert heads_cmd.HEADS.followup(options, spec, probes) == []
