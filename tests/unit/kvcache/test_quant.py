"""The KV-cache quantiser (SPEC.md "Quantised KV caches"), against the formula written out by hand."""

from __future__ import annotations

import pytest
import torch

from sinkscope.errors import SinkscopeError
from sinkscope.kvcache.quant import (KVQuant, complete_groups, error_bound, fake_quantize, quantize_keys,
                                quantize_values)


def _by_hand(group: torch.Tensor, bits: int) -> torch.Tensor:
    """scale = (max - min) / (2^b - 1), q = round((x - min) / scale), x' = q * scale + min: one group."""
    low, high = float(group.min()), float(group.max())
    scale = (high - low) / (2 ** bits - 1)
    return torch.tensor([round((float(x) - low) / scale) * scale + low for x in group])


@pytest.mark.parametrize("bits", [8, 4, 2])
def test_one_group_is_the_formula(bits):
    x = torch.randn(2, 16, generator=torch.Generator().manual_seed(bits))
    back = fake_quantize(x, bits, 8)  # two groups of 8 per row
    for row in range(2):
        for start in (0, 8):
            assert torch.allclose(back[row, start:start + 8], _by_hand(x[row, start:start + 8], bits), atol=1e-6)
    levels = {len(torch.unique(back[row, start:start + 8])) for row in range(2) for start in (0, 8)}
    assert max(levels) <= 2 ** bits


@pytest.mark.parametrize("bits", [8, 4, 3, 2])
@pytest.mark.parametrize("group", [32, 64, 128])
def test_the_round_trip_error_is_within_half_a_step(bits, group):
    x = torch.randn(3, 2, 40, 64, generator=torch.Generator().manual_seed(0)) * 3.0  # (B, H, S, D)
    x[..., 5] *= 20.0  # an outlier channel
    for dim in (-1, -2):
        back = fake_quantize(x, bits, group, dim=dim)
        bound = error_bound(x, bits, group, dim=dim)
        assert back.shape == x.shape and back.dtype == x.dtype
        assert ((back - x).abs() <= bound * (1 + 1e-5) + 1e-6).all()
        assert (back - x).abs().max() > 0  # it does quantise


def test_16_bits_is_the_tensor_itself_and_a_constant_group_comes_back_exactly():
    x = torch.randn(4, 64)
    assert fake_quantize(x, 16, 64) is x
    flat = torch.full((2, 32), 0.37)
    assert torch.equal(fake_quantize(flat, 2, 32), flat)


def test_a_shorter_last_group_is_quantised_on_its_own():
    x = torch.arange(10, dtype=torch.float32).view(1, 10) ** 2  # groups [0..7], [8, 9]
    back = fake_quantize(x, 2, 8)
    assert torch.allclose(back[0, :8], _by_hand(x[0, :8], 2), atol=1e-5)
    assert torch.equal(back[0, 8:], x[0, 8:])  # a 2-element group at 2 bits holds both ends exactly


def test_kivi_groups_keys_per_channel_along_tokens_and_per_token_along_channels():
    g = torch.Generator().manual_seed(3)
    keys = torch.randn(1, 2, 32, 16, generator=g)  # (B, H_kv, S, D)
    keys[..., 3] += 50.0  # an outlier channel: KIVI's reason to group keys per channel
    values = torch.randn(1, 2, 32, 16, generator=g)
    kivi, per_token = KVQuant(2, 16, "kivi"), KVQuant(2, 16, "per-token")
    k_kivi, k_token = quantize_keys(keys, kivi), quantize_keys(keys, per_token)
    # kivi: channel 3 of tokens 0..15 is one group; per-token: token 0's 16 channels are one group
    assert torch.allclose(k_kivi[0, 0, :16, 3], _by_hand(keys[0, 0, :16, 3], 2), atol=1e-4)
    assert torch.allclose(k_token[0, 0, 0], _by_hand(keys[0, 0, 0], 2), atol=1e-4)
    # the outlier channel ruins per-token groups, not per-channel ones
    ordinary = [c for c in range(16) if c != 3]
    assert (k_kivi - keys)[..., ordinary].abs().mean() < 0.5 * (k_token - keys)[..., ordinary].abs().mean()
    # values are per token in both schemes
    assert torch.equal(quantize_values(values, kivi), quantize_values(values, per_token))
    assert torch.allclose(quantize_values(values, kivi)[0, 1, 7], _by_hand(values[0, 1, 7], 2), atol=1e-5)
    with pytest.raises(ValueError):
        quantize_keys(keys[:, :, :20], kivi)  # kivi quantises whole token groups only


def test_kivi_waits_for_whole_groups_and_per_token_takes_everything():
    assert complete_groups(70, KVQuant(4, 32, "kivi")) == 64
    assert complete_groups(31, KVQuant(4, 32, "kivi")) == 0
    assert complete_groups(70, KVQuant(4, 32, "per-token")) == 70


def test_bad_settings_are_one_sentence():
    for kwargs, words in ((dict(bits=5), "bits"), (dict(group=1), "at least 2"), (dict(scheme="nf4"), "scheme")):
        with pytest.raises(SinkscopeError, match=words):
            KVQuant(**kwargs)
