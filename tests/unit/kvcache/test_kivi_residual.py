"""``--kv-scheme kivi`` is KIVI's cache (SPEC.md "Quantised KV caches"; Liu et al. 2024, ``models/llama_kivi.py``).

The reference below is written from KIVI's paper and code, not from sinkscope's quantiser: a cache
of full-precision keys and values beside their quantised parts. After each appended chunk (the
attention of the chunk's own queries is done by then):

- keys: the new keys join the full-precision residual; once it holds R or more, all but the last
  ``len mod R`` are quantised per channel, in groups of g consecutive tokens (decoding one token at
  a time: the R residual keys when the R-th arrives; a first chunk of n: all but the last n mod R);
- values: the new values join the full-precision window; all but the R most recent are quantised
  per token, in groups of g consecutive channels (one token at a time: the oldest one, when R + 1
  are held).

Quantisation is KIVI's ``quant_and_pack_kcache`` / ``quant_and_pack_vcache`` then dequantisation:
``mn, mx`` over the group, ``scale = (mx - mn) / (2^b - 1)``, ``q = round(clamp((x - mn) / scale))``,
``x' = q * scale + mn``.
"""

from __future__ import annotations

import pytest
import torch

from sinkscope.errors import SinkscopeError
from sinkscope.kvcache.policies import Policy
from sinkscope.kvcache.quant import KVQuant
from sinkscope.kvcache.slots import quantise_slots

H_KV, D = 2, 8


def _kivi_round_trip(groups: torch.Tensor, bits: int, dim: int) -> torch.Tensor:
    """KIVI's quantise-and-dequantise of ``groups`` (any shape), each group along ``dim``."""
    max_int = 2 ** bits - 1
    mn = groups.amin(dim, keepdim=True)
    mx = groups.amax(dim, keepdim=True)
    scale = (mx - mn) / max_int
    q = ((groups - mn) / scale).clamp(0, max_int).round()
    return q * scale + mn


def _kivi_keys(keys: torch.Tensor, bits: int, g: int) -> torch.Tensor:
    """Keys (H, T, D), T a multiple of g: per channel over g consecutive tokens."""
    H, T, _ = keys.shape
    grouped = keys.reshape(H, T // g, g, D)  # (H, T/g, g, D): a group is g tokens of one channel
    return _kivi_round_trip(grouped, bits, dim=2).reshape(H, T, D)


def _kivi_values(values: torch.Tensor, bits: int, g: int) -> torch.Tensor:
    """Values (H, T, D), D a multiple of g: per token over g consecutive channels."""
    H, T, _ = values.shape
    grouped = values.reshape(H, T, D // g, g)
    return _kivi_round_trip(grouped, bits, dim=3).reshape(H, T, D)


class KiviCache:
    """KIVI's cache of one layer: quantised keys and values, then their full-precision residuals."""

    def __init__(self, bits: int, g: int, R: int):
        assert R % g == 0  # llama_kivi.py: residual_length % group_size == 0
        self.bits, self.g, self.R = bits, g, R
        self.key_quant = self.value_quant = torch.zeros(H_KV, 0, D)
        self.key_full = self.value_full = torch.zeros(H_KV, 0, D)

    def append(self, keys: torch.Tensor, values: torch.Tensor) -> None:
        """A chunk's keys and values (H, n, D), after the chunk's attention."""
        self.key_full = torch.cat([self.key_full, keys], dim=1)
        ready = self.key_full.shape[1] - self.key_full.shape[1] % self.R
        if ready:
            self.key_quant = torch.cat([self.key_quant, _kivi_keys(self.key_full[:, :ready], self.bits, self.g)], 1)
            self.key_full = self.key_full[:, ready:]
        self.value_full = torch.cat([self.value_full, values], dim=1)
        old = max(self.value_full.shape[1] - self.R, 0)
        if old:
            self.value_quant = torch.cat([self.value_quant, _kivi_values(self.value_full[:, :old], self.bits, self.g)], 1)
            self.value_full = self.value_full[:, old:]

    def keys(self) -> torch.Tensor:
        return torch.cat([self.key_quant, self.key_full], dim=1)

    def values(self) -> torch.Tensor:
        return torch.cat([self.value_quant, self.value_full], dim=1)


def _chunks(total: int, sizes: list[int]) -> list[int]:
    """Chunk lengths covering ``total`` tokens: ``sizes`` in turn, the last one repeated."""
    out, i = [], 0
    while sum(out) < total:
        out.append(min(sizes[min(i, len(sizes) - 1)], total - sum(out)))
        i += 1
    return out


@pytest.mark.parametrize("bits", [2, 4])
@pytest.mark.parametrize("g, R, sizes", [
    (4, 4, [1]),            # KIVI's examples: R = g, decoding one token at a time
    (4, 8, [1]),            # R = 2 g
    (4, 8, [10, 1]),        # a first chunk (prefill) of 10, then one token at a time
    (4, 12, [5, 3, 7]),     # chunks of several tokens
    (4, 8, [16]),           # chunks of R and more
])
def test_kivi_is_kivis_cache_element_by_element_chunk_after_chunk(bits, g, R, sizes):
    generator = torch.Generator().manual_seed(bits * 100 + R + len(sizes))
    total = 41
    keys_all = torch.randn(H_KV, total, D, generator=generator)
    values_all = torch.randn(H_KV, total, D, generator=generator)
    reference = KiviCache(bits, g, R)
    policy = Policy("full", kv_bits=bits, kv_group=g, kv_scheme="kivi", kv_residual=R)
    keys = values = torch.zeros(1, H_KV, 0, D)
    exact = value_exact = torch.zeros(H_KV, 0, dtype=torch.bool)
    t = 0
    for n in _chunks(total, sizes):
        reference.append(keys_all[:, t:t + n], values_all[:, t:t + n])
        keys = torch.cat([keys, keys_all[None, :, t:t + n]], dim=2)  # (1, H_kv, S, D)
        values = torch.cat([values, values_all[None, :, t:t + n]], dim=2)
        fresh = torch.ones(H_KV, n, dtype=torch.bool)
        exact, value_exact = torch.cat([exact, fresh], 1), torch.cat([value_exact, fresh], 1)
        t += n
        orig = torch.arange(t).expand(H_KV, t)
        keys, values, _, exact, value_exact = quantise_slots(keys, values, None, orig, exact, policy, 0,
                                                             value_exact=value_exact)
        torch.testing.assert_close(keys[0], reference.keys(), rtol=0, atol=0)
        torch.testing.assert_close(values[0], reference.values(), rtol=0, atol=0)
        n_key_full, n_value_full = reference.key_full.shape[1], reference.value_full.shape[1]
        assert exact.sum(1).tolist() == [n_key_full] * H_KV and exact[:, t - n_key_full:].all()
        assert value_exact.sum(1).tolist() == [n_value_full] * H_KV and value_exact[:, t - n_value_full:].all()
        assert n_value_full == min(t, R)  # the R most recent values are always exact


def test_the_residual_defaults_to_the_group_and_is_a_whole_number_of_groups():
    assert KVQuant(2, 32, "kivi").residual_length == 32
    assert KVQuant(2, 32, "kivi", 128).residual_length == 128
    with pytest.raises(SinkscopeError, match="multiple of the group size 32"):
        KVQuant(2, 32, "kivi", 48)
    with pytest.raises(SinkscopeError, match="multiple of the group size 32"):
        Policy("full", kv_bits=2, kv_group=32, kv_residual=48)
    assert Policy("full", kv_bits=2, kv_group=32, kv_residual=128).label == "full, 2-bit kivi g32 r128"
    assert Policy("full", kv_bits=2, kv_group=32, kv_residual=32).label == "full, 2-bit kivi g32"


def test_kivi_grouped_keeps_sinkscopes_earlier_rule_a_value_with_its_key():
    generator = torch.Generator().manual_seed(1)
    keys, values = torch.randn(1, H_KV, 20, D, generator=generator), torch.randn(1, H_KV, 20, D, generator=generator)
    orig = torch.arange(20).expand(H_KV, 20)
    exact = torch.ones(H_KV, 20, dtype=torch.bool)
    policy = Policy("full", kv_bits=2, kv_group=8, kv_scheme="kivi-grouped")
    _, v, _, left, values_left = quantise_slots(keys, values, None, orig, exact, policy, 0)
    assert torch.equal(values_left, left) and not left[:, :16].any() and left[:, 16:].all()
    assert not torch.equal(v[:, :, 12:16], values[:, :, 12:16])  # recent values quantised with their keys' group
    torch.testing.assert_close(v[0, :, :16], _kivi_values(values[0, :, :16], 2, 8), rtol=0, atol=0)
