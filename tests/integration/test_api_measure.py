"""``sinkscope.api.measure`` on a tiny Llama built in the test, against the forward loop called directly.

Checked (what tests/test_api.py does not): the table of named probes measured on texts equals
``runner.run_probes`` on the same windows, and those windows are the tokenizer's ids of the text
cut as the corpus rule says (BOS first); a command's keyword options reach its probes (``heads``
equals the head_importance probe run with those parameters); a caller's model leaves in the mode
it came in and nothing is written; a sentence names options in the API's words (``seq_len``); and the
API-level mistakes (params= with a command, tokenizer= with a path, bad option values, float
windows) are one sentence in the API's words.
"""

from __future__ import annotations

import re

import numpy as np
import pandas as pd
import pytest

from sinkscope import api
from sinkscope.errors import SinkscopeError
from tiny_models import build, random_ids

TEXT = ("It is a truth universally acknowledged, that a single man in possession of a good fortune, "
        "must be in want of a wife. ") * 6


def assert_one_sentence(message: str, *words: str) -> None:
    """One line, one sentence (no full stop followed by a new capitalised sentence), naming ``words``."""
    assert "\n" not in message and message.endswith("."), message
    assert not re.search(r"[.!?]\s+[A-Z]", message), message
    for word in words:
        assert word in message, message


@pytest.fixture(scope="module")
def llama():
    return build("llama")


def reference_table(model, tokens: np.ndarray, specs: list[tuple[str, dict]]) -> pd.DataFrame:
    """The probes run by ``run_probes`` on ``tokens``, as a table (what the API must give)."""
    from sinkscope.capture import ModelSpec
    from sinkscope.probes import get_probe
    from sinkscope.store.results import rows_to_frame
    from sinkscope.forward.runner import run_probes

    spec = ModelSpec.from_model(model)
    probes = [get_probe(name)(spec, **params) for name, params in specs]
    run_probes(model, tokens, probes, batch_size=4, progress=False)
    return rows_to_frame([row for probe in probes for row in probe.rows()])


# ---- the table --------------------------------------------------------------------------------------------------


def test_named_probes_on_texts_equal_run_probes_on_the_same_windows(llama, tokenizer):
    result = api.measure(["p0_mass", "sink_rate"], llama, tokenizer, texts=TEXT, seq_len="16", n_seqs=2, bos="add",
                         params={"sink_rate": {"epsilon": 0.2, "layer_start": 1}})
    assert result.tokens.shape == (2, 16)
    ids = np.asarray(tokenizer(TEXT, add_special_tokens=False).input_ids)
    starts = result.manifest["windows"]["starts"]
    assert len(starts) == 2 and sorted(starts) == starts
    for row, (document, start) in zip(result.tokens, starts):  # BOS, then 15 consecutive ids of the text
        assert document == 0 and start % 15 == 0
        assert row[0] == tokenizer.bos_token_id and np.array_equal(row[1:], ids[start:start + 15])

    expected = reference_table(llama, result.tokens, [("p0_mass", {}), ("sink_rate", {"epsilon": 0.2,
                                                                                      "layer_start": 1})])
    pd.testing.assert_frame_equal(result.table, expected)
    late = result.table[result.table.metric == "sink_rate_from_layer"]
    assert late["layer_start"].tolist() == [1]


def test_a_commands_keyword_options_reach_its_probes(llama):
    ids = random_ids(2, 16, seed=2).numpy()
    result = api.measure("heads", llama, windows=ids, sink_set="first", dormant_below=0.6)
    expected = reference_table(llama, ids, [("head_importance", {"sink_set": "first", "dormant_below": 0.6})])
    pd.testing.assert_frame_equal(result.table, expected)
    assert result.manifest["command"] == "heads"
    assert result.manifest["options"]["dormant_below"] == 0.6 and result.manifest["options"]["sink_set"] == "first"


def test_a_callers_model_leaves_in_its_mode_and_nothing_is_written(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    model = build("llama").train()
    messages: list[str] = []
    result = api.measure("p0_mass", model, windows=random_ids(1, 8).numpy(), log=messages.append)
    assert model.training  # put back in training mode after the run
    assert result.path is None and list(tmp_path.iterdir()) == []
    assert any("llama" in message for message in messages)  # the progress messages went to log=
    assert set(result.table.probe) == {"p0_mass"}


# ---- the API's words ----------------------------------------------------------------------------------------------


# ---- mistakes -------------------------------------------------------------------------------------------------


def test_params_with_a_command_name_is_one_sentence(llama):
    with pytest.raises(SinkscopeError) as caught:
        api.measure("sinks", llama, windows=random_ids(1, 8).numpy(), params={"sink_rate": {"epsilon": 0.1}})
    assert_one_sentence(str(caught.value), "params=", "'sinks'", "keywords")


def test_a_tokenizer_with_a_model_named_by_path_is_one_sentence(tiny_llama_dir, tokenizer):
    with pytest.raises(SinkscopeError) as caught:
        api.measure("p0_mass", str(tiny_llama_dir), tokenizer, texts=TEXT, seq_len=8, n_seqs=1)
    assert_one_sentence(str(caught.value), "tokenizer=")


@pytest.mark.parametrize("options, words", [
    ({"n_seqs": 0}, ["n_seqs must be at least 1"]),
    ({"seq_len": 1}, ["seq_len must be at least 2"]),
    ({"batch_size": 0}, ["batch_size must be at least 1"]),
    ({"bos": "always"}, ["unknown bos 'always'"]),
    ({"attention": "flash"}, ["unknown attention 'flash'"]),
    ({"resume": True}, ["resume=True needs the out folder"]),
    ({"seed": -1}, ["seed must be a non-negative integer"]),
    ({"seq_len": "16,x"}, ["seq_len takes a length or comma-separated lengths"]),
])
def test_a_bad_option_value_is_one_sentence_in_the_apis_words(llama, tokenizer, options, words):
    with pytest.raises(SinkscopeError) as caught:
        api.measure("p0_mass", llama, tokenizer, texts=TEXT, **{"seq_len": 8, "n_seqs": 1, **options})
    message = str(caught.value)
    assert_one_sentence(message, *words)
    assert "--" not in message  # no CLI flag left in a notebook user's sentence


def test_an_unknown_option_of_a_command_is_one_sentence_with_a_suggestion(llama):
    with pytest.raises(SinkscopeError) as caught:
        api.measure("heads", llama, windows=random_ids(1, 8).numpy(), dormant_bellow=0.2)
    assert_one_sentence(str(caught.value), "heads has no option 'dormant_bellow'", "did you mean 'dormant_below'")


@pytest.mark.parametrize("windows, words", [
    (np.zeros((2, 8), dtype=np.float32), ["windows must be integer token ids", "floats"]),
    (np.zeros((8,), dtype=np.int64), ["windows must be token ids of shape", "(8,)"]),
    (np.zeros((1, 1), dtype=np.int64), ["windows must be token ids of shape"]),
])
def test_malformed_windows_are_one_sentence(llama, windows, words):
    with pytest.raises(SinkscopeError) as caught:
        api.measure("p0_mass", llama, windows=windows)
    assert_one_sentence(str(caught.value), *words)


def test_a_repeated_option_takes_one_number_too(llama):
    ids = random_ids(1, 12).numpy()
    one = api.measure("stream", llama, windows=ids, length=12, chunk=4, policy="full,window", cache=6)
    listed = api.measure("stream", llama, windows=ids, length=12, chunk=4, policy="full,window", cache=[6])
    pd.testing.assert_frame_equal(one.table, listed.table)
