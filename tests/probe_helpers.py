"""Helpers the probes' unit tests share (tests/unit/probes/): a small ModelSpec, rows by metric, one row,
and the one-sentence check of a refusal."""

from __future__ import annotations

import pytest

from sinkscope.capture.families import ModelSpec


def make_spec(n_layers: int = 3, n_heads: int = 4, hidden: int = 6) -> ModelSpec:
    return ModelSpec(family="test", n_layers=n_layers, n_heads=n_heads, n_kv_heads=n_heads, head_dim=4,
                     hidden_size=hidden, attention_layers=tuple(range(n_layers)), has_phantom=False,
                     has_output_gate=False)


def rows_by(rows, metric: str) -> dict:
    """{(layer, head, conditions as a tuple): value} of one metric's rows."""
    return {(r.layer, r.head, r.conditions): r.value for r in rows if r.metric == metric}


def one_row(rows, metric: str, **conditions):
    found = [r for r in rows if r.metric == metric
             and all(dict(r.conditions).get(k) == v for k, v in conditions.items())]
    assert len(found) == 1, (metric, conditions, found)
    return found[0]


def assert_one_sentence(error: pytest.ExceptionInfo) -> None:
    message = str(error.value)
    assert "\n" not in message and message.endswith("."), message
