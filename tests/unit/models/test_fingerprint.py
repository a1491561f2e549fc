"""models/fingerprint.py: two loads of the same weights hash alike, and any sampled change, shape, dtype or name
does not (issue 58)."""

from __future__ import annotations

import torch

from sinkscope.models.fingerprint import SAMPLE, weights_fingerprint
from tiny_models import build


def test_the_same_weights_hash_alike_and_other_weights_do_not():
    a, b, other = build("llama", seed=1), build("llama", seed=1), build("llama", seed=2)
    assert weights_fingerprint(a) == weights_fingerprint(b) != weights_fingerprint(other)
    assert len(weights_fingerprint(a)) == 64


def test_a_sampled_value_a_shape_a_dtype_and_a_name_each_change_it():
    model = torch.nn.Linear(128, 64)  # 8,192 weights: more than SAMPLE, so the sample skips some
    base = weights_fingerprint(model)
    with torch.no_grad():
        model.weight.view(-1)[0] += 1.0  # the first element is always sampled
    assert weights_fingerprint(model) != base
    assert weights_fingerprint(torch.nn.Linear(128, 64).double()) != weights_fingerprint(torch.nn.Linear(128, 64))
    small = torch.nn.Linear(4, 3)
    renamed = torch.nn.Sequential(small)
    assert weights_fingerprint(small) != weights_fingerprint(renamed)  # names "weight" vs "0.weight"
    assert model.weight.numel() > SAMPLE


def test_buffers_count_and_meta_tensors_hash_by_shape():
    norm = torch.nn.BatchNorm1d(4)
    before = weights_fingerprint(norm)
    norm.running_mean += 1
    assert weights_fingerprint(norm) != before
    with torch.device("meta"):
        meta = torch.nn.Linear(4, 3)
    assert weights_fingerprint(meta) == weights_fingerprint(meta)
