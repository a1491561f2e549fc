"""``forward/explorer_pass.py``: the explorer's own pass on a tiny Llama, and the token labels.

Checked: nothing runs for ``none`` or 0 windows; the pass keeps the first windows of the tokens
in one batch and records what it kept in the manifest's words; labels are the tokenizer's text of
each id alone, or the ids without a tokenizer.
"""

from __future__ import annotations

import numpy as np

from sinkscope.capture.families import ModelSpec
from sinkscope.forward.explorer_pass import explore, token_labels
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


# ---- batches of --batch-size, within the budget (issue 60) ---------------------------------------------------


def _arrays(data) -> dict:
    return {name: getattr(data, name) for name in ("heads", "chosen", "windows", "labels", "blocks", "indptr", "keys",
                                                   "codes", "value_norms", "phantom", "p0")}


def test_the_stored_data_does_not_depend_on_the_batch_size():
    """Batch 1 and batch N store the same arrays and manifest record, with and without a budget that binds."""
    model = build("llama")
    tokens = random_ids(5, 24, seed=3).numpy()
    for max_mb in (None, 0.004):
        found = [_explore(model, tokens, heads="all", windows=5, max_mb=max_mb, batch_size=b) for b in (1, 2, 5)]
        (first, record), rest = found[0], found[1:]
        for data, other in rest:
            for name, array in _arrays(first).items():
                np.testing.assert_array_equal(getattr(data, name), array, err_msg=name)
            assert data.left_out == first.left_out and other == record
    assert record["patterns_left_out"] > 0  # the budget bound


def test_windows_past_the_budget_keep_no_entries(monkeypatch):
    """Once the windows read cost more than the page's budget, later batches keep only what the file holds
    for a pattern left out (row counts, value norms, phantom mass): memory follows the budget."""
    from sinkscope.probes import explorer

    kept: list[dict] = []
    original = explorer.Explorer.data

    def spy(self, labels, chosen=None):
        kept.extend(p for windows in self.patterns.values() for p in windows.values())
        return original(self, labels, chosen)

    monkeypatch.setattr(explorer.Explorer, "data", spy)
    model = build("llama")
    tokens = random_ids(6, 24, seed=4).numpy()
    data, record = _explore(model, tokens, heads="all", windows=6, max_mb=0.004, batch_size=1)
    beyond = [p for p in kept if p.get("beyond")]
    assert beyond and all("keys" not in p for p in beyond)
    assert record["patterns_kept"] + record["patterns_left_out"] == 6 * 12
    assert len(data.beyond) == 0 and data.left_out  # fit turned them into left-out patterns
    monkeypatch.setattr(explorer.Explorer, "keep_within", lambda self, max_bytes, labels_bytes: None)
    whole, whole_record = _explore(model, tokens, heads="all", windows=6, max_mb=0.004, batch_size=1)
    for name, array in _arrays(whole).items():  # every entry kept until fit: the same result
        np.testing.assert_array_equal(getattr(data, name), array, err_msg=name)
    assert data.left_out == whole.left_out and record == whole_record


def test_a_budget_that_is_not_a_finite_positive_number_is_one_sentence():
    import pytest

    from sinkscope.errors import SinkscopeError

    model = build("llama")
    tokens = random_ids(1, 8).numpy()
    for bad in (float("inf"), float("nan"), -1.0, 0):
        with pytest.raises(SinkscopeError, match="must be a finite number of MB above 0"):
            _explore(model, tokens, max_mb=bad)
