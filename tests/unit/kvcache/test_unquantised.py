"""``kvcache/unquantised.py``: which quantised conditions hold every key and value exact (issue 62, item 3).

Checked against the rules of ``quant.complete_groups`` and ``slots.quantise_slots`` as SPEC.md states them:
protection that covers the document or every slot; kivi (and kivi-grouped) whose cache never holds R
quantisable keys, with values that stay among the R most recent; and the near misses that do quantise
(a cache of exactly R, sinks' old values under kivi, per-token, 16 bits). The reader agrees bit for bit
(tests/integration/commands/test_stream_quantised.py).
"""

from __future__ import annotations

import pytest

from sinkscope.kvcache.policies import Policy
from sinkscope.kvcache.unquantised import capacity, nothing_quantised_note, why_nothing_quantised

L = 512


@pytest.mark.parametrize("policy", [
    Policy("window", 16, kv_bits=2, kv_group=64),                                   # the group 64, cache 16
    Policy("window", 16, kv_bits=2, kv_group=64, kv_scheme="kivi-grouped"),
    Policy("window", 64, kv_bits=2, kv_group=32, kv_residual=128),                  # R, not the group, decides
    Policy("sinks", 16, 4, kv_bits=2, kv_group=64, protect_sinks=4),                # sinks' old values protected
    Policy("window", 16, kv_bits=2, kv_group=8, kv_scheme="per-token", protect="top-p0:1000"),
    Policy("sinks", 16, 4, kv_bits=2, kv_group=8, kv_scheme="per-token", protect_sinks=1000),
    Policy("window", 16, kv_bits=2, kv_group=8, protect="random:16"),
    Policy("full", kv_bits=4, kv_group=16, kv_scheme="per-token", protect_sinks=L),
    Policy("full", kv_bits=4, kv_group=16, protect_sinks=500),                     # 12 quantisable keys < R = 16
], ids=lambda p: p.label)
def test_conditions_that_quantise_nothing_are_named(policy):
    why = why_nothing_quantised(policy, L)
    assert why
    note = nothing_quantised_note(policy, L)
    assert note.startswith(f"note: {policy.label} quantises nothing: ") and "16-bit" in note and "\n" not in note


@pytest.mark.parametrize("policy", [
    Policy("window", 16, kv_bits=2, kv_group=16),                                   # a cache of exactly R: quantised
    Policy("sinks", 16, 4, kv_bits=2, kv_group=64),                                 # kivi quantises the sinks' values
    Policy("h2o", 16, recent=8, kv_bits=2, kv_group=64),                            # and old heavy hitters' values
    Policy("window", 16, kv_bits=2, kv_group=64, kv_scheme="per-token"),            # every token at once
    Policy("window", 16, kv_bits=2, kv_group=8, protect="top-p0:15"),
    Policy("window", 16, kv_bits=2, kv_group=8, kv_scheme="per-token", protect_sinks=500),  # tokens 500.. quantised
    Policy("full", kv_bits=2, kv_group=64),
    Policy("window", 16),                                                           # 16 bits: nothing to say
], ids=lambda p: p.label)
def test_conditions_that_may_quantise_are_not_named(policy):
    assert why_nothing_quantised(policy, L) is None and nothing_quantised_note(policy, L) is None


def test_a_short_document_bounds_the_cache():
    assert capacity(Policy("window", 256, kv_bits=2), 40) == 40 and capacity(Policy("full", kv_bits=2), 40) == 40
    assert why_nothing_quantised(Policy("full", kv_bits=2, kv_group=64), 40)   # 40 tokens never make a block of 64
    assert why_nothing_quantised(Policy("full", kv_bits=2, kv_group=64), 64) is None


def test_transformers_quantiser_is_left_alone():
    policy = Policy("full", kv_bits=2, kv_group=64, kv_scheme="per-token", kv_backend="transformers")
    assert why_nothing_quantised(policy, 40) is None
