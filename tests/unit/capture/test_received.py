"""The attention each key receives, from the kernel call that makes the layer's output (issue 56, item 1).

``kernels.attention_with_received`` against an explicit softmax (phantom column appended when the head has a
learned sink; masks, causal and sliding windows; grouped queries; several query blocks), and, on every tiny
family, a fused record's ``received`` against the column sums of eager attention's own weights
(``output_attentions``) within 1e-5, with the model's logits unchanged. The slow test does the same on the
bundled SmolLM2.
"""

from __future__ import annotations

import pytest
import torch

from sinkscope.capture import capture, hooks as hp
from sinkscope.capture.kernels import attention_with_received
from sinkscope.capture.masks import hidden_keys
from tiny_models import FAMILY_NAMES, build, random_ids


def _reference(q, k, v, scale, mask, window, sinks):
    """Explicit float64 attention: (out over real keys, lse, sum over queries of a_ij)."""
    B, H, T, _ = q.shape
    S = k.shape[2]
    groups = H // k.shape[1]
    k, v = k.double().repeat_interleave(groups, 1), v.double().repeat_interleave(groups, 1)  # (B, H, S, D)
    s = q.double() @ k.transpose(-1, -2) * scale  # (B, H, T, S)
    if mask is not None:
        s = s + mask.double()
    else:
        rows = torch.arange(T).unsqueeze(-1) + S - T
        s = s.masked_fill(hidden_keys(rows, torch.arange(S).unsqueeze(0), window), float("-inf"))
    lse = torch.logsumexp(s, -1)  # (B, H, T)
    w = torch.exp(s - lse.unsqueeze(-1))  # (B, H, T, S) over real keys
    if sinks is None:
        a = w
    else:
        column = sinks.double().expand(B, H, T).unsqueeze(-1)  # (B, H, T, 1)
        a = torch.softmax(torch.cat([s, column], -1), -1)[..., :-1]  # the phantom in the normaliser
    return w @ v, lse, a.sum(2)


CASES = {
    "causal": dict(masked=False, window=None, sinks=None),
    "window": dict(masked=False, window=5, sinks=None),
    "mask": dict(masked=True, window=None, sinks=None),
    "sink per head": dict(masked=False, window=None, sinks="head"),
    "sink per query, mask": dict(masked=True, window=None, sinks="query"),
}


@pytest.mark.parametrize("case", CASES, ids=list(CASES))
@pytest.mark.parametrize("block_bytes", [64 * 2 ** 20, 4 * 2 * 8 * 20 * 3])  # one block; blocks of 3 queries
def test_the_kernel_returns_the_explicit_output_lse_and_column_sums(case, block_bytes):
    setting = CASES[case]
    g = torch.Generator().manual_seed(0)
    B, H, Hkv, T, S, D, Dv = 2, 8, 2, 11, 20, 16, 12
    q = torch.randn(B, H, T, D, generator=g)
    k, v = torch.randn(B, Hkv, S, D, generator=g), torch.randn(B, Hkv, S, Dv, generator=g)
    mask = None
    if setting["masked"]:
        visible = torch.rand(B, 1, T, S, generator=g) > 0.3
        visible[..., -1] = True  # every row sees a key
        mask = torch.zeros(B, 1, T, S).masked_fill(~visible, torch.finfo(torch.float32).min)
    sinks = None
    if setting["sinks"] == "head":
        sinks = torch.randn(1, H, 1, generator=g)
    elif setting["sinks"] == "query":
        sinks = torch.randn(B, H, T, generator=g)
    out, lse, received = attention_with_received(q, k, v, 0.25, mask, window=setting["window"], sink_rows=sinks,
                                                 block_bytes=block_bytes)
    want_out, want_lse, want_received = _reference(q, k, v, 0.25, mask, setting["window"], sinks)
    assert out.shape == (B, H, T, Dv) and lse.shape == (B, H, T) and received.shape == (B, H, S)
    torch.testing.assert_close(out.double(), want_out, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(lse.double(), want_lse, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(received.double(), want_received, atol=1e-5, rtol=1e-5)


class _Received:
    """Asks for the kernel's column sums and keeps every record."""

    observed = frozenset({hp.ATTN})
    intervened = frozenset()

    def __init__(self, columns: frozenset):
        self.record_columns = columns
        self.records = []

    def emit(self, template, layer, record):
        self.records.append(record)

    def replace(self, template, layer, value):
        return value


def _check_family(model, ids) -> None:
    with torch.no_grad():
        reference = model(ids, output_attentions=True)
        asked, unasked = _Received(frozenset({"received"})), _Received(frozenset())
        with capture(model, asked, mode="fused"):
            logits = model(ids).logits
        with capture(model, unasked, mode="fused"):
            model(ids)
    torch.testing.assert_close(logits, reference.logits, atol=1e-4, rtol=1e-4)
    eager = [w for w in reference.attentions if w is not None]
    assert len(eager) == len(asked.records) == len(unasked.records)
    for weights, record, plain in zip(eager, asked.records, unasked.records):
        want = weights.float().sum(2)  # (B, H, S): a_ij summed over queries (a phantom's share left out)
        if record.received is None:  # a path that makes no fused call (soft-capping): the record's own sums
            assert record.weights is not None or record.mask is not None
        torch.testing.assert_close(record.received_mass(), want, atol=1e-5, rtol=1e-5)
        assert plain.received is None
        torch.testing.assert_close(plain.received_mass(block_bytes=4 * ids.shape[0] * record.n_heads
                                                       * record.key.shape[-2] * 5), want, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("family", FAMILY_NAMES)
def test_a_fused_record_receives_what_eager_weights_sum_to(family):
    """Every family: the kernel's column sums (asked), and the record's own blocked sums (not asked), equal eager
    attention's weights summed over queries within 1e-5; the model's logits are what it computes itself."""
    _check_family(build(family), random_ids(2, 24))


@pytest.mark.slow
def test_smollm2_receives_what_eager_weights_sum_to():
    from sinkscope.models.resolve import resolve_source
    from sinkscope.run.loaders import load_model

    loaded = load_model(resolve_source(None), device="cpu", dtype="float32", log=lambda m: None)
    model = loaded.model
    model.config._attn_implementation = "eager"
    ids = loaded.tokenizer("It is a truth universally acknowledged, that a single man in possession of a good "
                           "fortune, must be in want of a wife.", return_tensors="pt").input_ids
    _check_family(model, ids)


@pytest.mark.parametrize("sink", [None, "head", "query"])
@pytest.mark.parametrize("fused", [True, False])
def test_a_records_cuts_answer_as_the_whole_record(sink, fused):
    """``first_windows`` and ``one_head`` (the explorer keeps such cuts): every reduction of the cut equals the whole
    record's for those windows and that head (GQA, a sliding-window mask, learned phantoms per head or per query)."""
    from synthetic_attention import make_layer

    record = make_layer(0, B=3, H=4, Hkv=2, T=9, seed=4, sink=sink, window=5, fused=fused).record
    head = 3
    for cut, windows, heads in ((record.first_windows(2), slice(0, 2), slice(None)),
                                (record.one_head(head), slice(None), slice(head, head + 1)),
                                (record.first_windows(2).one_head(head, copy=True), slice(0, 2), slice(head, head + 1))):
        for name in ("lse", "real_mass", "phantom_mass", "received_mass"):
            torch.testing.assert_close(getattr(cut, name)(), getattr(record, name)()[windows, heads], atol=1e-6, rtol=1e-6)
        torch.testing.assert_close(cut.key_mass(0), record.key_mass(0)[windows, heads], atol=1e-6, rtol=1e-6)
        torch.testing.assert_close(cut.row_logits(slice(2, 6)), record.row_logits(slice(2, 6))[windows, heads])
        if not fused:
            torch.testing.assert_close(cut.weights, record.weights[windows, heads])
        torch.testing.assert_close(cut.value_norms(), record.value_norms()[windows, slice(None) if heads == slice(None)
                                                                            else slice(head // 2, head // 2 + 1)])
