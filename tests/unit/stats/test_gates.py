"""The data-driven sink set's rule (gates.data_sink_keys; SPEC.md "Implicit gate and head importance"):
a key needs enough scoring queries, so that a key near the window's end, scored by one or two queries,
is not a sink by accident (issue 39, item 2)."""

from __future__ import annotations

import torch

from sinkscope.stats.gates import DATA_SINK_MIN_QUERIES, data_sink_keys


def _window(T: int, late: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Causal weights (1, 1, T, T): every query puts 0.5 on key 0, and the queries after ``late`` put their
    remaining 0.5 on key ``late``; all value norms 1 except keys 0 and ``late`` (0.1)."""
    visible = torch.ones(T, T, dtype=torch.bool).tril().view(1, 1, T, T)
    weights = torch.zeros(1, 1, T, T)
    weights[..., 0, 0] = 1.0
    for i in range(1, T):
        weights[0, 0, i, 0] = 0.5
        other = late if i >= late else i
        weights[0, 0, i, other] += 0.5
    norms = torch.ones(1, 1, T)
    norms[..., 0] = norms[..., late] = 0.1
    return weights, visible, norms


def test_a_late_key_scored_by_few_queries_is_not_a_sink():
    weights, visible, norms = _window(128, late=126)  # key 126 is scored by queries 126 and 127 only
    keys = data_sink_keys(weights, visible, norms)[0, 0]
    assert keys[0] and not keys[126]
    assert data_sink_keys(weights, visible, norms, min_queries=1)[0, 0, 126]  # the old rule took it


def test_the_minimum_is_capped_at_half_the_best_scored_keys_queries():
    weights, visible, norms = _window(12, late=5)  # key 5: 7 scoring queries; key 0: 11, so the cap is 6
    keys = data_sink_keys(weights, visible, norms, min_queries=DATA_SINK_MIN_QUERIES)[0, 0]
    assert keys[0] and keys[5]
    late = data_sink_keys(*_window(12, late=7), min_queries=DATA_SINK_MIN_QUERIES)[0, 0]  # key 7: 5 queries < 6
    assert late[0] and not late[7]
