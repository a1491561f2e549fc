"""``probes/massive_topk.py``: the distinct top-k residual entries with Sun et al.'s criterion, and the intervention.

``MassiveTopK`` is fed synthetic ``tokens`` (B, T) and ``hook_resid_post`` values (B, T, C) on a
hand-written ``ModelSpec``, in several batchings. The reference is plain Python / numpy float64
over every entry of every window (SPEC.md "Massive activations"): per (position, channel) the
largest |h| over windows (the earliest window on a tie) with that window's token and signed value,
the k largest keys (equal values ordered by key), ``massive`` = |h| > min_abs and |h| >= min_ratio x
``np.median`` of the window's |h|, and ``massive_count`` the mean number of such entries per window.
``fold_top`` is checked against a dictionary fold; ``MassiveIntervention`` against hand-set tensors
and the mean of the fed losses.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from sinkscope.capture.families import ModelSpec
from sinkscope.errors import SinkscopeError
from sinkscope.probes.massive_topk import (FIELDS, INTERVENED, MassiveIntervention, MassiveTopK, fold_top,
                                           format_entry)

L, B, T, C = 2, 5, 6, 8
MIN_ABS, MIN_RATIO, K = 10.0, 8.0, 6
SPEC = ModelSpec(family="test", n_layers=L, n_heads=2, n_kv_heads=2, head_dim=4, hidden_size=C,
                 attention_layers=(0, 1), has_phantom=False, has_output_gate=False)


def one_sentence(error: pytest.ExceptionInfo) -> str:
    message = str(error.value)
    assert "\n" not in message and message.endswith("."), message
    return message


def _data(seed: int = 0) -> tuple[np.ndarray, list[np.ndarray]]:
    """(ids (B, T), [h (B, T, C) per layer]) with Sun et al.'s pattern planted."""
    rng = np.random.default_rng(seed)
    ids = rng.integers(0, 500, size=(B, T))  # (B, T): position 0's token differs, to see which window is named
    hidden = []
    for layer in range(L):
        h = rng.normal(size=(B, T, C))  # (B, T, C)
        h[4] *= 12.0  # a loud window: large |h| everywhere, none massive against its own median
        h[:, 0] = h[0, 0]  # position 0 holds the same state in every window (BOS) ...
        h[:, 0, 3] = 100.0 * (1 + layer)  # ... with a massive entry at (0, 3): counts once, named by window 0
        h[3, 2, 5] = -70.0  # a massive negative entry in one window
        if layer == 1:
            h[1, 4, 6] = 55.0  # massive only from layer 1 on
        hidden.append(h)
    return ids, hidden


def _reference(ids: np.ndarray, h: np.ndarray, k: int, min_abs: float = MIN_ABS,
               min_ratio: float = MIN_RATIO) -> tuple[list[dict], float]:
    """The distinct top k of one layer's (B, T, C) over windows, and the mean count meeting the criterion."""
    n_windows, length, width = h.shape
    best: dict[tuple[int, int], tuple[float, int]] = {}
    for b in range(n_windows):
        for t in range(length):
            for c in range(width):
                v = abs(float(h[b, t, c]))
                if (t, c) not in best or v > best[t, c][0]:  # strictly larger: the earliest window on a tie
                    best[t, c] = (v, b)
    medians = np.median(np.abs(h).reshape(n_windows, -1), axis=1)  # (B,)
    meets = (np.abs(h) > min_abs) & (np.abs(h) >= min_ratio * medians[:, None, None])  # (B, T, C)
    order = sorted(best.items(), key=lambda item: (-item[1][0], item[0][0] * width + item[0][1]))[:k]
    top = [{"rank": rank, "value": v, "position": t, "channel": c, "token": int(ids[b, t]),
            "signed": float(h[b, t, c]), "massive": int(meets[b, t, c])}
           for rank, ((t, c), (v, b)) in enumerate(order, start=1)]
    return top, meets.reshape(n_windows, -1).sum(1).mean()


def _run(ids: np.ndarray, hidden: list[np.ndarray], splits: tuple[int, ...], **params) -> MassiveTopK:
    probe = MassiveTopK(SPEC, top_k=K, min_abs=MIN_ABS, min_ratio=MIN_RATIO, **params)
    start = 0
    for size in splits:
        part = slice(start, start + size)
        probe.tokens(None, torch.from_numpy(ids[part]))  # (b, T)
        for layer, h in enumerate(hidden):
            probe.residual(layer, torch.from_numpy(h[part]).float())  # (b, T, C) float32, as a model gives
        start += size
    return probe


@pytest.mark.parametrize("splits", [(B,), (2, 3), (1, 1, 1, 1, 1)])
def test_top_k_rows_equal_the_distinct_largest_entries_in_any_batching(splits):
    ids, hidden = _data()
    rows = _run(ids, hidden, splits).rows()
    for layer, h in enumerate(hidden):
        h32 = h.astype(np.float32).astype(np.float64)  # the values the probe saw
        want, count = _reference(ids, h32, K)
        got = [r for r in rows if r.metric == "massive_topk" and r.layer == layer]
        assert [dict(r.conditions)["rank"] for r in got] == list(range(1, K + 1))
        for row, ref in zip(got, want):
            cond = dict(row.conditions)
            assert (cond["position"], cond["channel"], cond["token_id"], cond["massive"]) == \
                   (ref["position"], ref["channel"], ref["token"], ref["massive"])
            assert row.value == ref["value"] and cond["signed"] == ref["signed"] and row.n == B
        assert [r.value for r in rows if r.metric == "massive_count" and r.layer == layer] == \
               [pytest.approx(count, rel=1e-12)]
        # the planted pattern: (0, 3) once, named by the first window's token; the loud window never massive
        assert sum(1 for r in got if (dict(r.conditions)["position"], dict(r.conditions)["channel"]) == (0, 3)) == 1
        assert got[0].value == 100.0 * (1 + layer) and dict(got[0].conditions)["token_id"] == ids[0, 0]
        assert any(r["massive"] == 0 for r in want) and any(r["massive"] == 1 for r in want)


def test_fewer_entries_than_k_leave_no_empty_rows():
    ids = np.arange(6).reshape(3, 2)  # (B, T)
    h = np.random.default_rng(1).normal(size=(3, 2, 3))  # (B, T, C): 6 distinct (position, channel) keys
    probe = MassiveTopK(SPEC, top_k=10, min_abs=0.5, min_ratio=1.0)
    probe.tokens(None, torch.from_numpy(ids))
    probe.residual(0, torch.from_numpy(h))
    rows = [r for r in probe.rows() if r.metric == "massive_topk"]
    want, count = _reference(ids, h, k=10, min_abs=0.5, min_ratio=1.0)
    assert [(dict(r.conditions)["position"], dict(r.conditions)["channel"]) for r in rows] == \
           [(w["position"], w["channel"]) for w in want]
    assert len(rows) == 6 and {r.layer for r in probe.rows()} == {0}  # layer 1 saw nothing: no rows
    assert [r.value for r in probe.rows() if r.metric == "massive_count"] == [pytest.approx(count)]


def test_means_and_intervention_entries():
    ids, hidden = _data(seed=2)
    probe = _run(ids, hidden, (2, 3), means=True)
    for layer, position, channel in ((0, 0, 3), (1, 2, 5), (1, 5, 7)):
        want = hidden[layer].astype(np.float32).astype(np.float64)[:, position, channel].mean()
        assert probe.mean_at(layer, position, channel) == pytest.approx(want, rel=1e-12)
    first: dict[tuple[int, int], int] = {}
    for layer, h in enumerate(hidden):
        for e in _reference(ids, h.astype(np.float32).astype(np.float64), K)[0]:
            if e["massive"]:
                first.setdefault((e["position"], e["channel"]), layer)
    want = sorted((layer, p, c) for (p, c), layer in first.items())
    assert probe.intervention_entries() == want
    assert (0, 0, 3) in want and (1, 4, 6) in want and (0, 2, 5) in want  # the planted ones, at their first layer
    without = _run(ids, hidden, (B,))
    with pytest.raises(SinkscopeError) as error:
        without.mean_at(0, 0, 3)
    one_sentence(error)


def test_shares_merge_to_the_rows_of_one_probe():
    ids, hidden = _data(seed=3)
    whole = _run(ids, hidden, (B,), means=True, clean_loss=True)
    first = _run(ids[:2], [h[:2] for h in hidden], (2,), means=True, clean_loss=True)
    second = _run(ids[2:], [h[2:] for h in hidden], (3,), means=True, clean_loss=True)
    first.merge(second)
    key = lambda r: (r.metric, r.layer, r.conditions, r.n)  # noqa: E731
    assert [key(r) for r in first.rows()] == [key(r) for r in whole.rows()]
    np.testing.assert_allclose([r.value for r in first.rows()], [r.value for r in whole.rows()], rtol=1e-12)
    assert first.mean_at(1, 3, 2) == pytest.approx(whole.mean_at(1, 3, 2), rel=1e-12)


def test_fold_top_keeps_each_keys_largest_and_orders_ties_by_key():
    rng = np.random.default_rng(4)
    for _ in range(40):
        k = int(rng.integers(1, 6))
        n_old, n_new = int(rng.integers(0, 6)), int(rng.integers(1, 8))
        values = rng.integers(0, 4, size=n_old + n_new).astype(float)  # small integers: many ties
        keys = rng.integers(0, 5, size=n_old + n_new)
        tags = np.arange(n_old + n_new)  # which entry was kept (carried in the token field)

        def fields(part):
            return {"value": torch.tensor(values[part], dtype=torch.float64),
                    "signed": torch.tensor(-values[part], dtype=torch.float64),
                    "key": torch.tensor(keys[part], dtype=torch.int64),
                    "token": torch.tensor(tags[part], dtype=torch.int64),
                    "massive": torch.zeros(len(values[part]), dtype=torch.float64)}
        out = fold_top(fields(slice(0, n_old)), fields(slice(n_old, None)), k)
        best: dict[int, int] = {}
        for i in range(n_old + n_new):  # buffer first, then candidates: the earlier wins a tie
            if keys[i] not in best or values[i] > values[best[keys[i]]]:
                best[keys[i]] = i
        kept = sorted(best.values(), key=lambda i: (-values[i], keys[i]))[:k]
        m = len(kept)
        assert out["key"][:m].tolist() == [int(keys[i]) for i in kept]
        assert out["token"][:m].tolist() == [int(i) for i in kept]
        assert out["value"][:m].tolist() == [values[i] for i in kept]
        assert set(out) == set(FIELDS) and all(len(t) == min(k, n_old + n_new) for t in out.values())
        assert out["key"][m:].tolist() == [-1] * (len(out["key"]) - m)  # fewer keys than k: empty slots


@pytest.mark.parametrize("params", [{"top_k": 0}, {"min_abs": -1.0}, {"min_ratio": -0.5}, {"means": "often"},
                                    {"topk": 3}])
def test_massive_topk_bad_parameters_are_one_sentence(params):
    with pytest.raises(SinkscopeError) as error:
        MassiveTopK(SPEC, **params)
    one_sentence(error)


# ---- massive_intervention ------------------------------------------------------------------------------


def test_the_intervention_sets_exactly_its_entries_on_its_own_pass():
    probe = MassiveIntervention(SPEC, entries=("0:0:3=0.0", "1:2:5=-1.5", "1:9:0=2", format_entry(1, 1, 1, 7.25)))
    assert probe.passes() == (None, INTERVENED)
    h = torch.randn(2, T, C)  # (B, T, C)
    original = h.clone()
    assert probe.set_entries(0, h) is None  # the clean pass is not changed
    probe.pass_label = INTERVENED
    for layer, expected in ((0, {(0, 3): 0.0}), (1, {(2, 5): -1.5, (1, 1): 7.25})):  # position 9 >= T: skipped
        got = probe.set_entries(layer, h)  # (B, T, C)
        want = original.clone()
        for (position, channel), value in expected.items():
            want[:, position, channel] = value
        assert torch.equal(got, want)
    assert torch.equal(h, original)  # the hook value itself is not changed in place


def test_intervention_rows_are_the_loss_means_their_difference_and_perplexities():
    rng = np.random.default_rng(5)
    clean = rng.uniform(1.0, 4.0, size=(3, T - 1))  # (B, T-1)
    changed = rng.uniform(1.0, 4.0, size=(3, T - 1))
    probe = MassiveIntervention(SPEC, entries=("0:0:3=0", "1:0:3=0"), mode="mean")
    probe.pass_label = None
    probe.loss(None, torch.from_numpy(clean))
    probe.pass_label = INTERVENED
    probe.loss(None, torch.from_numpy(changed))
    rows = {r.metric: r for r in probe.rows()}
    assert rows["massive_loss_clean"].value == pytest.approx(clean.mean(), rel=1e-12)
    assert rows["massive_loss_intervened"].value == pytest.approx(changed.mean(), rel=1e-12)
    assert rows["massive_loss_delta"].value == pytest.approx(changed.mean() - clean.mean(), rel=1e-10)
    assert rows["massive_ppl_clean"].value == pytest.approx(math.exp(clean.mean()), rel=1e-12)
    assert rows["massive_ppl_intervened"].value == pytest.approx(math.exp(changed.mean()), rel=1e-12)
    assert rows["massive_entries"].value == 2.0
    assert all(r.n == clean.shape[0] and r.layer is None for r in rows.values())  # n: the windows


def test_no_entries_is_no_change_and_a_given_clean_loss_skips_the_clean_pass():
    nothing = MassiveIntervention(SPEC, clean_sum=30.0, clean_n=10)
    assert nothing.passes() == ()
    rows = {r.metric: r.value for r in nothing.rows()}
    assert rows["massive_loss_clean"] == rows["massive_loss_intervened"] == 3.0
    assert rows["massive_loss_delta"] == 0.0 and rows["massive_entries"] == 0.0
    assert MassiveIntervention(SPEC, entries=("0:0:0=1",), clean_sum=1.0, clean_n=1).passes() == (INTERVENED,)
    empty = {r.metric: r.value for r in MassiveIntervention(SPEC).rows()}
    assert math.isnan(empty["massive_loss_clean"]) and math.isnan(empty["massive_ppl_clean"])


@pytest.mark.parametrize("params, words", [({"entries": ("2:0:3=0",)}, "names layer 2"),
                                           ({"entries": ("0:0:3",)}, "LAYER:POSITION:CHANNEL=VALUE"),
                                           ({"entries": ("a:0:3=0",)}, "LAYER:POSITION:CHANNEL=VALUE"),
                                           ({"mode": "half"}, "zero, mean"),
                                           ({"clean_n": -3}, "0 or more")])
def test_intervention_bad_parameters_are_one_sentence(params, words):
    with pytest.raises(SinkscopeError) as error:
        MassiveIntervention(SPEC, **params)
    assert words in one_sentence(error)


@pytest.mark.parametrize("value", ["1.2.3", "e", "--1"])
def test_an_entry_value_that_is_not_a_number_is_one_sentence(value):
    with pytest.raises(SinkscopeError) as error:
        MassiveIntervention(SPEC, entries=(f"0:0:3={value}",))
    one_sentence(error)
