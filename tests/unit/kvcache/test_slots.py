"""A quantised cache's slots after a chunk (kvcache/slots.py), on a synthetic cache against the quantiser."""

from __future__ import annotations

import torch

from sinkscope.kvcache.policies import Policy
from sinkscope.kvcache.quant import KVQuant, quantize_keys, quantize_values
from sinkscope.kvcache.slots import guard_slots, quantise_slots


def _cache(S: int = 20, D: int = 8):
    g = torch.Generator().manual_seed(0)
    keys, values = torch.randn(1, 2, S, D, generator=g), torch.randn(1, 2, S, D, generator=g)  # (1, H_kv, S, D)
    orig = torch.arange(S).expand(2, S)  # (H_kv, S)
    return keys, values, orig, torch.ones(2, S, dtype=torch.bool)


def test_per_token_quantises_every_unprotected_slot_once():
    keys, values, orig, exact = _cache()
    policy = Policy("full", kv_bits=2, kv_group=8, kv_scheme="per-token", protect_sinks=3)
    k, v, _, left, values_left = quantise_slots(keys, values, None, orig, exact, policy, 0)
    assert torch.equal(values_left, left)  # per-token: a value with its key
    assert left[:, :3].all() and not left[:, 3:].any()
    assert torch.equal(k[:, :, :3], keys[:, :, :3]) and torch.equal(v[:, :, :3], values[:, :, :3])
    setting = KVQuant(2, 8, "per-token")
    assert torch.allclose(k[:, :, 3:], quantize_keys(keys[:, :, 3:], setting), atol=1e-6)
    assert torch.allclose(v[:, :, 3:], quantize_values(values[:, :, 3:], setting), atol=1e-6)
    again, _, _, _, _ = quantise_slots(k, v, None, orig, left, policy, 0, value_exact=values_left)
    assert torch.equal(again, k)  # nothing is quantised twice


def test_kivi_takes_whole_groups_oldest_first_and_leaves_the_rest_exact():
    keys, values, orig, exact = _cache(S=20)
    policy = Policy("full", kv_bits=4, kv_group=8, kv_scheme="kivi")
    k, v, _, left, values_left = quantise_slots(keys, values, None, orig, exact, policy, 0)
    assert not left[:, :16].any() and left[:, 16:].all()  # two groups of 8; 4 wait
    assert not values_left[:, :12].any() and values_left[:, 12:].all()  # the values of the 8 newest stay exact
    assert torch.equal(v[:, :, 12:], values[:, :, 12:])
    assert torch.allclose(k[:, :, 8:16], quantize_keys(keys[:, :, 8:16], KVQuant(4, 8, "kivi")), atol=1e-6)
    assert torch.equal(k[:, :, 16:], keys[:, :, 16:])


def test_guards_hold_the_heaviest_or_random_keys_of_the_pool():
    _, _, orig, exact = _cache(S=10)
    mass = torch.tensor([[5.0, 1, 1, 9, 1, 1, 1, 1, 1, 2], [1.0, 1, 1, 1, 1, 1, 1, 7, 1, 1]]).double()
    generator = torch.Generator().manual_seed(0)
    top = guard_slots(("top-p0", 2), exact, orig, 0, mass, None, generator)
    assert top[0].nonzero().squeeze(1).tolist() == [0, 3] and top[1].nonzero().squeeze(1).tolist()[0] == 0
    assert top.sum(1).tolist() == [2, 2]  # ties go to the earlier slot: head 1 holds 0 and 7
    assert top[1].nonzero().squeeze(1).tolist() == [0, 7]
    exact[:, 0] = False  # a quantised key is never restored
    assert not guard_slots(("top-p0", 2), exact, orig, 0, mass, None, generator)[:, 0].any()
    held = torch.zeros(2, 10, dtype=torch.bool)
    held[:, 5] = True
    drawn = guard_slots(("random", 3), exact, orig, 2, None, held, generator)
    assert drawn[:, 5].all() and drawn.sum(1).tolist() == [3, 3] and not drawn[:, :2].any()
