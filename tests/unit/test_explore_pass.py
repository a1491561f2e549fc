"""``explore_pass.py``: the explorer's own pass on a tiny Llama, and the token labels.

Checked: nothing runs for ``none`` or 0 windows; the pass keeps the first windows of the tokens
in one batch and records what it kept in the manifest's words; labels are the tokenizer's text of
each id alone, or the ids without a tokenizer.
"""

from __future__ import annotations

import numpy as np

from sinkscope.capture.families import ModelSpec
from sinkscope.explore_pass import explore, token_labels
from tiny_models import build, random_ids


def _explore(model, tokens, **options):
    settings = {"heads": "auto", "windows": 2, "max_mb": None, "seed": 0, "attention": "fused", "device": None,
                "log": lambda message: None, **options}
    return explore(model, None, ModelSpec.from_model(model), tokens, **settings)


def test_nothing_to_explore():
    model = build("llama")
    tokens = random_ids(3, 10).numpy()
    assert _explore(model, tokens, heads="none") is None
    assert _explore(model, tokens, windows=0) is None


def test_the_first_windows_are_kept_and_recorded():
    model = build("llama")
    tokens = random_ids(3, 10, seed=1).numpy()
    data, record = _explore(model, tokens, heads="0.1,2.3", windows=5)
    assert data.windows.tolist() == [0, 1, 2]
    assert record["heads"] == [[0, 1], [2, 3]] or record["heads"] == [[2, 3], [0, 1]]
    assert record["patterns_kept"] == 6 and record["patterns_left_out"] == 0 and record["max_mb"] is None
    assert data.labels[1].tolist() == [str(i) for i in tokens[1]]  # no tokenizer: the ids


def test_token_labels(tokenizer):
    ids = np.array(tokenizer("the cat sat")["input_ids"])
    assert token_labels(tokenizer, ids) == [tokenizer.decode([int(i)]) for i in ids]
    assert token_labels(None, np.array([5, 7])) == ["5", "7"]
