"""The additive masks (``capture/masks.py``) against masks written out by hand, entry by entry.

The reference for every entry is the rule in words: query i (of T, the last T of S positions)
may see key j when j <= i + S - T; a sparse indexer leaves visible only the keys it selected; a
``position_bias`` is added to every logit. Visible entries are 0, hidden ones the dtype's minimum.
"""

from __future__ import annotations

import torch

from sinkscope.capture.masks import _additive, causal_additive_mask, fold_into_mask, sparse_index_mask

MIN = torch.finfo(torch.float32).min


def _by_hand(T: int, S: int, visible) -> torch.Tensor:
    """(1, 1, T, S): 0 where ``visible(i, j)``, the float32 minimum elsewhere."""
    rows = [[0.0 if visible(i, j) else MIN for j in range(S)] for i in range(T)]
    return torch.tensor(rows, dtype=torch.float32).view(1, 1, T, S)


def _qk(T: int, S: int, B: int = 1) -> tuple[torch.Tensor, torch.Tensor]:
    return torch.zeros(B, 2, T, 4), torch.zeros(B, 2, S, 4)  # (B, H, T, D), (B, Hkv, S, D)


def test_causal_mask_hides_the_future_keys():
    for T, S in ((4, 4), (2, 5), (1, 3)):
        got = causal_additive_mask(T, S, torch.float32, "cpu")
        assert got.shape == (1, 1, T, S) and got.dtype == torch.float32
        assert torch.equal(got, _by_hand(T, S, lambda i, j: j <= i + S - T))
    assert causal_additive_mask(2, 2, torch.bfloat16, "cpu")[0, 0, 0, 1] == torch.finfo(torch.bfloat16).min


def test_additive_turns_a_keep_mask_into_zeros_and_minimums():
    keep = torch.tensor([[True, False, True], [False, False, True]]).view(1, 1, 2, 3)
    assert torch.equal(_additive(keep, torch.float32), _by_hand(2, 3, lambda i, j: bool(keep[0, 0, i, j])))
    floats = torch.tensor([0.0, -1.5, MIN], dtype=torch.float64).view(1, 1, 1, 3)
    passed = _additive(floats, torch.float32)
    assert passed.dtype == torch.float32 and torch.equal(passed, floats.float())


def test_sparse_index_mask_leaves_only_the_selected_causal_keys():
    T, S = 3, 5
    query, key = _qk(T, S)
    indices = torch.tensor([[[0, 2], [1, 4], [0, 9]]])  # (B, T, k); 9 is out of range and clamped to S - 1
    chosen = [{0, 2}, {1, 4}, {0, 4}]
    got = sparse_index_mask(None, indices, query, key)
    assert got.shape == (1, 1, T, S)
    assert torch.equal(got, _by_hand(T, S, lambda i, j: j <= i + S - T and j in chosen[i]))
    # over a given keep-mask (wider than S: cut to S), the selection hides the rest
    keep = torch.ones(1, 1, T, S + 2, dtype=torch.bool)
    keep[0, 0, :, 1] = False
    got = sparse_index_mask(keep, indices, query, key)
    assert torch.equal(got, _by_hand(T, S, lambda i, j: j != 1 and j in chosen[i]))


def test_sparse_index_mask_without_indices_is_the_mask_itself():
    query, key = _qk(2, 2)
    mask = torch.zeros(1, 1, 2, 2)
    assert sparse_index_mask(mask, None, query, key) is mask
    assert sparse_index_mask(None, None, query, key) is None


def test_fold_into_mask_adds_the_position_bias_and_takes_both_extras_out():
    T, S = 2, 3
    query, key = _qk(T, S)
    bias = torch.arange(2 * T * (S + 1), dtype=torch.float32).view(1, 2, T, S + 1)  # (1, H, T, S + 1): cut to S
    kwargs = {"position_bias": bias, "indices": torch.tensor([[[0, 1], [0, 2]]]), "scaling": 0.5}
    got = fold_into_mask(None, kwargs, query, key)
    assert kwargs == {"scaling": 0.5}
    chosen = [{0, 1}, {0, 2}]
    expected = _by_hand(T, S, lambda i, j: j <= i + S - T and j in chosen[i]) + bias[..., :S]
    assert got.shape == (1, 2, T, S) and torch.equal(got, expected)
    # a bias alone, over the causal mask
    kwargs = {"position_bias": bias}
    assert torch.equal(fold_into_mask(None, kwargs, query, key),
                       _by_hand(T, S, lambda i, j: j <= i + S - T) + bias[..., :S])


def test_fold_into_mask_without_extras_changes_nothing():
    query, key = _qk(2, 2)
    mask, kwargs = torch.zeros(1, 1, 2, 2), {"scaling": 0.5}
    assert fold_into_mask(mask, kwargs, query, key) is mask and kwargs == {"scaling": 0.5}
    assert fold_into_mask(None, {}, query, key) is None
