"""``StreamNLL`` and ``reading_conditions`` (probes/stream_nll.py) against numpy on synthetic per-token NLLs.

Checked: the reading conditions of a run, in table order, by SPEC.md's rules (full once; per
positions and cache: window, sinks for 0 < n < cache, h2o with R = round(C * share) clipped to
[1, C - 1], none for C < 2; sinks with n = 0 is window); the rows per condition: ``stream_nll``
= the mean over every predicted token of every window read, ``se`` the sd (n - 1) over windows
of the per-window means / sqrt(n) (NaN for one window), ``stream_ppl = exp(stream_nll)`` with
``se`` ppl * se, ``n`` the tokens, and the same per ``position_bucket`` (the position of a value
is that of the token it predicts, 1 .. L - 1; a bucket starts at a multiple of ``bucket``); a
condition with no window read has no rows; two shares merged (and a state reloaded) give the
rows of one probe that read everything; ``arrays`` and ``options``; bad parameters refused.

Reference: numpy means and standard deviations over the NLL arrays handed to ``add`` (docs/SPEC.md
"Streaming under a bounded KV cache", "Rows").
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from sinkscope.errors import SinkscopeError
from sinkscope.probes.stream_nll import StreamNLL, reading_conditions
from sinkscope.kvcache.policies import Policy
from synthetic_attention import spec

LENGTH, BUCKET, N_WINDOWS = 9, 3, 4


def _probe(**params) -> StreamNLL:
    base = dict(policies=("full", "window", "sinks"), caches=(4,), sink_tokens=(1,), positions=("cache",),
                length=LENGTH, bucket=BUCKET, n_windows=N_WINDOWS)
    return StreamNLL(spec(), **{**base, **params})


def _nll(seed: int) -> np.ndarray:
    """(C, N, L - 1) float32-representable NLLs."""
    rng = np.random.default_rng(seed)
    return rng.gamma(2.0, 1.5, size=(3, N_WINDOWS, LENGTH - 1)).astype(np.float32).astype(np.float64)


def _expected(policy: Policy, nll: np.ndarray) -> dict[tuple, tuple[float, float, int]]:
    """{(metric, position_bucket): (value, se, n)} from the windows read, nll (n, L - 1); ``n`` the windows read."""
    n = nll.shape[0]
    out = {}
    positions = np.arange(1, LENGTH)  # the predicted token's position
    starts = positions // BUCKET * BUCKET
    for bucket, columns in [(None, np.ones(LENGTH - 1, bool))] + [(int(s), starts == s) for s in np.unique(starts)]:
        per_doc = nll[:, columns].mean(axis=1)  # (n,)
        mean = float(per_doc.mean())
        se = float(np.std(per_doc, ddof=1) / math.sqrt(n)) if n > 1 else math.nan
        out[("stream_nll", bucket)] = (mean, se, n)
        out[("stream_ppl", bucket)] = (math.exp(mean), math.exp(mean) * se, n)
    return out


def _check(rows, conditions: list[Policy], nll: np.ndarray, read: np.ndarray) -> None:
    """Every condition with a window read has exactly the expected rows; the others have none."""
    got: dict[tuple, object] = {}
    for row in rows:
        columns = dict(row.conditions)
        key = (columns["policy"], columns["cache"], columns["sink_tokens"], columns["positions"], row.metric,
               columns["position_bucket"])
        assert key not in got and row.layer is None and row.head is None
        got[key] = row
    want = {}
    for c, policy in enumerate(conditions):
        if read[c].any():
            for (metric, bucket), value in _expected(policy, nll[c][read[c]]).items():
                want[(policy.name, policy.cache, policy.sink_tokens, policy.positions, metric, bucket)] = value
    assert set(got) == set(want), set(got) ^ set(want)
    for key, (value, se, n) in want.items():
        row = got[key]
        assert row.value == pytest.approx(value, rel=1e-9), key
        assert row.n == n, key
        assert (math.isnan(row.se) and math.isnan(se)) or row.se == pytest.approx(se, rel=1e-9), (key, row.se, se)


def test_reading_conditions_follow_the_spec_rules():
    got = reading_conditions(("full", "window", "sinks", "h2o"), (1, 4, 8), (0, 1, 4), ("cache", "original"), 0.5)
    want = [Policy("full")]
    for where in ("cache", "original"):
        for cache in (1, 4, 8):
            want.append(Policy("window", cache, 0, where))  # sinks with n = 0 is window
            want += [Policy("sinks", cache, n, where) for n in (1, 4) if n < cache]
            if cache >= 2:
                want.append(Policy("h2o", cache, 0, where, min(cache - 1, max(1, round(cache * 0.5)))))
    assert got == want
    assert reading_conditions(("sinks",), (4,), (0,), ("cache",), 0.5) == [Policy("window", 4, 0, "cache")]
    assert reading_conditions(("sinks",), (4,), (2,), ("cache",), 0.5) == [Policy("sinks", 4, 2, "cache")]
    assert reading_conditions(("h2o",), (2,), (), ("original",), 0.9)[0].recent == 1  # at most C - 1
    assert reading_conditions(("h2o",), (8,), (), ("original",), 0.01)[0].recent == 1  # at least 1


def test_rows_per_condition_and_bucket():
    probe = _probe()
    assert [p.name for p in probe.conditions] == ["full", "window", "sinks"]
    nll = _nll(600)
    read = np.zeros((3, N_WINDOWS), bool)
    read[0] = True  # full: every window
    read[1, [0, 2]] = True  # window: two of them
    read[2, 3] = True  # sinks: one window, so no se
    for c in range(3):
        for w in np.flatnonzero(read[c]):
            probe.add(int(c), int(w), torch.from_numpy(nll[c, w]))
    _check(probe.rows(), probe.conditions, nll, read)
    np.testing.assert_array_equal(probe.arrays()["stream_nll"][read], nll[read].astype(np.float32))


def test_a_condition_without_reads_has_no_rows():
    probe = _probe()
    nll = _nll(610)
    read = np.zeros((3, N_WINDOWS), bool)
    read[1] = True
    for w in range(N_WINDOWS):
        probe.add(1, w, torch.from_numpy(nll[1, w]))
    rows = probe.rows()
    assert {dict(r.conditions)["policy"] for r in rows} == {"window"}
    _check(rows, probe.conditions, nll, read)


def test_merged_shares_and_a_reloaded_state_give_the_rows_of_one_probe():
    nll = _nll(620)
    whole, share_a, share_b = _probe(), _probe(), _probe()
    for c in range(3):
        for w in range(N_WINDOWS):
            whole.add(c, w, torch.from_numpy(nll[c, w]))
            (share_a if w < 2 else share_b).add(c, w, torch.from_numpy(nll[c, w]))
    resumed = _probe()
    resumed.load_state_dict(share_b.state_dict())
    share_a.merge(resumed)
    read = np.ones((3, N_WINDOWS), bool)
    _check(share_a.rows(), share_a.conditions, nll, read)
    assert share_a.rows() == whole.rows()


def test_options_list_the_conditions_in_array_order():
    probe = _probe(policies=("full", "h2o"), caches=("4",))  # caches may come as strings (the CLI)
    assert probe.caches == (4,)
    labels = [c["label"] for c in probe.options()["conditions"]]
    assert labels == [p.label for p in probe.conditions] == ["full", "h2o 2+2 (cache positions)"]
    assert probe.arrays()["stream_nll"].shape == (2, N_WINDOWS, LENGTH - 1)


@pytest.mark.parametrize("params", [{"caches": (0,)}, {"caches": ("x",)}, {"length": 1}, {"bucket": 0},
                                    {"policies": ("lru",)}, {"h2o_recent": 1.0}, {"mode": "dense"}])
def test_bad_parameters_are_refused(params):
    with pytest.raises(SinkscopeError):
        _probe(**params)
