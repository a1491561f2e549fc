"""``capture/window_masks.py``: a plain causal sliding window is left to the kernel, every other mask is transformers'.

The mask functions are transformers' own (``masking_utils``); a None mask is returned only for a
sliding-window causal function with no padding, no cache and the causal skip allowed, and the
fused capture then gives the same numbers as the explicit reference with no (T, S) mask built.
"""

from __future__ import annotations

import pytest
import torch
from transformers.masking_utils import (causal_mask_function, chunked_causal_mask_function,
                                        sliding_window_causal_mask_function)

from sinkscope.capture import hooks as hp, kernels as K, capture
from sinkscope.capture.window_masks import fused_eager_mask, fused_sdpa_mask, is_plain_window
from tests.tiny_models import build, random_ids


def _asked(**changes) -> dict:
    """The keywords ``create_sliding_window_causal_mask`` hands a mask function, window 8, 24 tokens."""
    kwargs = dict(batch_size=2, q_length=24, kv_length=24, q_offset=0, kv_offset=0,
                  mask_function=sliding_window_causal_mask_function(8), attention_mask=None,
                  allow_is_causal_skip=True, local_size=8, dtype=torch.float32, use_vmap=False, device="cpu")
    kwargs.update(changes)
    return kwargs


def test_only_a_plain_sliding_window_is_left_out():
    assert is_plain_window(_asked())
    assert fused_sdpa_mask(**_asked(), window_named=lambda: True) is None
    assert fused_eager_mask(**_asked(), none_allowed=lambda: True, window_named=lambda: True) is None
    # a model whose calls do not name their window (Phi-MoE) keeps transformers' mask
    assert fused_sdpa_mask(**_asked(), window_named=lambda: False).shape == (2, 1, 24, 24)
    assert fused_eager_mask(**_asked(), none_allowed=lambda: True, window_named=lambda: False) is not None
    refused = {
        "chunked attention (Llama 4)": _asked(mask_function=chunked_causal_mask_function(8, torch.zeros(2, dtype=int))),
        "a window the function does not have": _asked(local_size=6),
        "plain causal under a local size": _asked(mask_function=causal_mask_function),
        "padding": _asked(attention_mask=torch.ones(2, 24, dtype=torch.bool)),
        "a cache": _asked(q_offset=16, kv_length=40, q_length=24),
        "a static cache's tensor offset": _asked(q_offset=torch.tensor(0)),
        "overlays (skip not allowed)": _asked(allow_is_causal_skip=False),
        "no local size (full attention)": _asked(local_size=None),
    }
    for why, kwargs in refused.items():
        assert not is_plain_window(kwargs), why
    mask = fused_sdpa_mask(**_asked(attention_mask=torch.ones(2, 24, dtype=torch.bool)), window_named=lambda: True)
    assert mask.shape == (2, 1, 24, 24) and mask.dtype == torch.bool  # transformers' own
    eager = fused_eager_mask(**_asked(), none_allowed=lambda: False, window_named=lambda: True)  # may edit it as floats
    assert eager.dtype == torch.float32 and eager.shape == (2, 1, 24, 24)


class _Records:
    observed = frozenset({hp.ATTN})
    intervened = frozenset()
    record_columns = frozenset()

    def __init__(self):
        self.records = {}

    def emit(self, template, layer, record):
        self.records[layer] = record

    def replace(self, template, layer, value):
        return value


@pytest.mark.parametrize("family", ["gpt_oss", "gemma3_text"])
def test_sliding_layers_run_windowed_with_no_mask_and_match_explicit(family):
    """gpt-oss (no SDPA, flash attention) and Gemma 3 (SDPA): the sliding layers' records have no mask,
    the kernel ran with the window, and every row's key-0 mass equals the explicit weights'."""
    model = build(family)
    ids = random_ids(2, 24)  # window 8 < 24 keys: the window binds
    K.reset_kernel_state()
    fused, explicit = _Records(), _Records()
    with torch.no_grad():
        with capture(model, fused, mode="fused"):
            model(ids)
        with capture(model, explicit, mode="explicit"):
            model(ids)
    kinds = {(c["window"], c["masked"]) for c in K.kernel_choices()}
    assert (8, False) in kinds and all(not masked for _, masked in kinds)  # windowed, never an explicit mask
    for layer, record in fused.records.items():
        assert record.mask is None
        reference = explicit.records[layer]
        assert record.sliding_window == reference.sliding_window
        torch.testing.assert_close(record.key_mass(0, over="all"), reference.key_mass(0, over="all"),
                                   atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(record.key_visible(0), reference.key_visible(0))
    assert {r.sliding_window for r in fused.records.values()} == {8, None}


def test_a_plain_causal_mask_is_left_out_only_for_models_that_take_none():
    causal = _asked(mask_function=causal_mask_function, local_size=None)
    named = dict(window_named=lambda: False)  # plain causal needs no named window
    assert fused_eager_mask(**causal, none_allowed=lambda: True, **named) is None
    assert fused_eager_mask(**causal, none_allowed=lambda: False, **named).shape == (2, 1, 24, 24)
    padded = dict(causal, attention_mask=torch.ones(2, 24, dtype=torch.bool))
    assert fused_eager_mask(**padded, none_allowed=lambda: True, **named).shape == (2, 1, 24, 24)
    window = _asked(mask_function=sliding_window_causal_mask_function(8), local_size=None)
    assert fused_eager_mask(**window, none_allowed=lambda: True, window_named=lambda: True) is not None  # no local size


def test_discovery_knows_whether_the_calls_name_their_window():
    from sinkscope.capture.families import family_of

    assert family_of(build("gpt_oss")).window_kwarg and family_of(build("gemma3_text")).window_kwarg
    assert not family_of(build("gpt2")).window_kwarg  # GPT-2's attention names no window
