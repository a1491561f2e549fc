"""``sinkscope stream`` as declared in ``sinkscope.commands.stream``, called directly (no CLI).

Checked: the options dataclass (one document per batch whatever is asked) and its registration;
the check, which normalises the CLI's comma-separated values into tuples, sets ``seq_len`` to
``--length`` and can run twice; every kind of option mistake as one sentence naming the option;
the probe list (the stream probe's parameters are exactly the ones it declares, plus p0_mass, and
phantom_mass on a model with a phantom); and the command's window reader on a tiny Llama: the
``full`` condition's per-token NLL is the model's dense next-token loss, a small window cache
changes it, and p0_mass beside it is measured on the first ``max(cache)`` tokens.
"""

from __future__ import annotations

import math
import re
from types import SimpleNamespace

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from sinkscope.commands import get_command
from sinkscope.commands import stream as stream_cmd
from sinkscope.errors import SinkscopeError
from sinkscope.commands.spec import RunOptions


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


def checked(**options) -> stream_cmd.StreamOptions:
    result = stream_cmd.StreamOptions(**options)
    stream_cmd.STREAM.check(result)
    return result


# ---- the declaration ------------------------------------------------------------------------------------------


def test_stream_is_registered_and_reads_its_own_windows():
    command = get_command("stream")
    assert command is stream_cmd.STREAM
    assert command.options is stream_cmd.StreamOptions and issubclass(command.options, RunOptions)
    assert command.reads_past_context and command.read_windows is not None and command.followup is None


def test_one_document_per_batch_whatever_is_asked():
    options = stream_cmd.StreamOptions(batch_size=8)
    assert options.batch_size == 1 and options.n_seqs == 1
    assert options.policy == stream_cmd.POLICIES and options.positions == ("cache",)


# ---- the check normalises ----------------------------------------------------------------------------------


def test_the_check_turns_cli_values_into_tuples_and_sets_seq_len():
    options = stream_cmd.StreamOptions(length=64, cache=("16,32",), sink_tokens="0, 4", policy="full,sinks",
                                       positions=("cache", "original"), chunk=8, bucket=16)
    options.batch_size = 3  # as a caller could set it after construction
    stream_cmd.STREAM.check(options)
    assert options.cache == (16, 32) and options.sink_tokens == (0, 4)
    assert options.policy == ("full", "sinks") and options.positions == ("cache", "original")
    assert options.seq_len == 64 and options.batch_size == 1
    before = (options.cache, options.sink_tokens, options.policy, options.positions, options.seq_len)
    stream_cmd.STREAM.check(options)  # the pipeline may check normalised options again
    assert (options.cache, options.sink_tokens, options.policy, options.positions, options.seq_len) == before


def test_a_seq_len_equal_to_the_length_is_accepted():
    assert checked(length=32, seq_len=32, cache=(8,)).seq_len == 32


def test_the_mask_mode_takes_static_policies_at_original_positions():
    options = checked(mode="mask", policy="full,window,sinks", positions="original", length=32, cache=(8,))
    assert options.mode == "mask" and "h2o" not in options.policy


# ---- mistakes -------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("options, words", [
    ({"length": 1}, ["--length"]),
    ({"length": 64, "seq_len": 32}, ["--seq-len", "--length"]),
    ({"cache": ("a",)}, ["--cache"]),
    ({"cache": (0,)}, ["--cache", ">= 1"]),
    ({"cache": ()}, ["--cache"]),
    ({"cache": ("128,128",)}, ["--cache", "twice"]),
    ({"sink_tokens": (-1,)}, ["--sink-tokens", ">= 0"]),
    ({"sink_tokens": ("4,4",)}, ["--sink-tokens", "twice"]),
    ({"policy": ("lru",)}, ["--policy", "'lru'"]),
    ({"policy": ()}, ["--policy"]),
    ({"policy": ("full,full",)}, ["--policy", "twice"]),
    ({"positions": ("absolute",)}, ["--positions", "'absolute'"]),
    ({"positions": ("cache,cache",)}, ["--positions", "twice"]),
    ({"chunk": 0}, ["--chunk"]),
    ({"bucket": 0}, ["--bucket"]),
    ({"h2o_recent": 0.0}, ["--h2o-recent"]),
    ({"h2o_recent": 1.0}, ["--h2o-recent"]),
    ({"h2o_recent": math.nan}, ["--h2o-recent"]),
    ({"mode": "fast"}, ["--mode", "'fast'"]),
    ({"mode": "mask", "positions": ("original",)}, ["--mode mask", "h2o", "--policy"]),
    ({"mode": "mask", "policy": ("full", "window")}, ["--mode mask", "--positions"]),
    ({"mode": "mask", "policy": ("full",), "positions": ("original",), "length": stream_cmd.MASK_MODE_MAX_LENGTH + 1},
     ["--mode mask", "--length", str(stream_cmd.MASK_MODE_MAX_LENGTH)]),
    ({"policy": ("sinks",), "cache": (4,), "sink_tokens": (4, 8)}, ["--sink-tokens 4", "--cache"]),
    ({"policy": ("sinks",), "cache": (2, 16), "sink_tokens": (4,)}, ["--sink-tokens 4", "a cache of 2"]),  # not dropped
    ({"policy": ("h2o",), "cache": (1,)}, ["h2o", "--cache 2 or more"]),
    ({"policy": ("window", "h2o"), "cache": (1, 64)}, ["h2o", "--cache 2 or more"]),
    ({"kv_bits": "2", "kv_group": "32,64", "kv_residual": 96}, ["--kv-residual", "64"]),
])
def test_an_option_mistake_is_one_sentence_naming_the_option(options, words):
    with pytest.raises(SinkscopeError) as caught:
        checked(**options)
    assert_one_sentence(str(caught.value), *words)


def test_sink_tokens_that_fill_the_cache_are_fine_without_the_sinks_policy_or_with_zero():
    checked(policy=("window",), cache=(4,), sink_tokens=(8,))
    checked(policy=("sinks",), cache=(4,), sink_tokens=(0, 2))  # 0 sink tokens: the window policy


# ---- the probe list -------------------------------------------------------------------------------------------


@pytest.mark.parametrize("has_phantom", [False, True])
def test_the_probe_list_is_the_stream_probe_and_the_sink_metrics_beside_it(has_phantom):
    from sinkscope.probes import get_probe

    options = checked(length=40, cache="8,16", sink_tokens="2", policy="full,sinks,h2o", positions="original",
                      chunk=4, h2o_recent=0.25, bucket=10, n_seqs=3)
    probes = stream_cmd.STREAM.probes(options, SimpleNamespace(has_phantom=has_phantom))
    (name, params), *beside = probes
    assert name == "stream"
    assert params == {"policies": ("full", "sinks", "h2o"), "caches": (8, 16), "sink_tokens": (2,),
                      "positions": ("original",), "chunk": 4, "mode": "stream", "h2o_recent": 0.25, "bucket": 10,
                      "length": 40, "n_windows": 3, "kv_bits": (16,), "kv_group": (64,), "kv_scheme": ("kivi",),
                      "protect_sinks": (0,), "protect": (), "kv_backend": "sinkscope", "kv_residual": 0}
    declared = get_probe("stream").params
    assert set(params) == {p.name for p in declared}  # every parameter the probe declares, and no other
    assert get_probe("stream").resolve_params(params) == params
    assert beside == [("p0_mass", {})] + ([("phantom_mass", {})] if has_phantom else [])


# ---- the window reader ----------------------------------------------------------------------------------------


def test_the_reader_gives_the_dense_loss_for_full_and_p0_mass_on_the_first_cache_tokens():
    from sinkscope.capture import ModelSpec
    from sinkscope.probes import get_probe
    from sinkscope.forward.runner import run_probes
    from tiny_models import build, random_ids

    model = build("llama")
    spec = ModelSpec.from_model(model)
    length, cache = 9, 3
    options = checked(length=length, cache=(cache,), policy="full,window", positions="original", chunk=3, n_seqs=2)
    probes = [get_probe(name)(spec, **params) for name, params in stream_cmd.STREAM.probes(options, spec)]
    ids = random_ids(2, length, seed=5)
    messages: list[str] = []
    used = stream_cmd.STREAM.read_windows(model, ids.numpy(), probes, batch_size=1, progress=False,
                                          log=messages.append)
    assert used == 1 and messages  # one document at a time; it says what it reads
    stream, p0 = probes
    assert [(c.name, c.cache) for c in stream.conditions] == [("full", None), ("window", cache)]

    with torch.no_grad():
        logits = model(ids, use_cache=False).logits
    dense = F.cross_entropy(logits[:, :-1].transpose(1, 2), ids[:, 1:], reduction="none")  # (2, L - 1)
    nll = stream.per_token()  # (conditions, windows, L - 1)
    assert nll.shape == (2, 2, length - 1)
    torch.testing.assert_close(nll[0], dense, rtol=1e-4, atol=1e-4)
    assert not torch.allclose(nll[1], dense, atol=1e-4)  # 3 keys kept: the evictions change the loss

    alone = get_probe("p0_mass")(spec)
    run_probes(model, ids[:, :cache].numpy(), [alone], batch_size=2, progress=False)  # the first max(cache) tokens
    np.testing.assert_allclose([r.value for r in p0.rows()], [r.value for r in alone.rows()], rtol=1e-6)


def test_the_command_reader_hands_everything_to_the_stream_reader(monkeypatch):
    """``read_windows`` imports the torch-side reader only when called, and forwards its arguments as given."""
    import sinkscope.forward.stream.windows as windows_mod

    calls = []
    monkeypatch.setattr(windows_mod, "read_windows", lambda *args, **kwargs: calls.append((args, kwargs)) or 7)
    assert stream_cmd.STREAM.read_windows("model", "tokens", ["probe"], batch_size=1, start=2) == 7
    assert calls == [(("model", "tokens", ["probe"]), {"batch_size": 1, "start": 2})]
