"""``Explorer`` (probes/explorer.py) against the float64 reference of synthetic attention records.

Checked: every kept weight is a_qj (phantom in the normaliser, what eager attention returns) to
within half a code (1/65,535) and every weight below the threshold is dropped; the value norms are
||v_j|| of each query head's KV head; the phantom mass is phi_q; the position-0 mass is the mean
over queries q >= 1 of w_q0; explicit, fused and weights-only records and sliding windows alike;
``none`` keeps only every head's p0, from which ``choose_heads`` takes ``auto``'s AUTO_TOP heads of
highest p0 plus its seeded sample; ``all`` keeps every head and ``L.H`` the heads named; query
blocks give the same entries as one block.

Reference: synthetic_attention.make_layer's numpy softmax (docs/SPEC.md "The explorer").
"""

from __future__ import annotations

import numpy as np
import pytest

from sinkscope.store.explorer_format import AUTO_SAMPLE, AUTO_TOP, SCALE, THRESHOLD, choose_heads
from sinkscope.probes import explorer as explorer_mod
from sinkscope.probes.explorer import Explorer
from synthetic_attention import make_layer, spec


def _labels(windows: int, T: int) -> dict[int, list[str]]:
    return {w: [f"t{i}" for i in range(T)] for w in range(windows)}


def _run(probe: Explorer, layers: dict) -> None:
    for l, layer in layers.items():
        probe.attention(l, layer.record)


@pytest.mark.parametrize("kind", ["explicit", "fused", "weights_only"])
@pytest.mark.parametrize("sink", [None, "head"])
@pytest.mark.parametrize("window", [None, 5])
def test_kept_patterns_equal_the_reference(kind, sink, window):
    L, H, T, B = 2, 4, 12, 2
    probe = Explorer(spec(n_layers=L, n_heads=H, has_phantom=sink is not None), heads="all")
    layers = {l: make_layer(l, B=B, H=H, T=T, seed=5 + l, sink=sink, window=window, fused=kind == "fused",
                            weights_only=kind == "weights_only") for l in range(L)}
    _run(probe, layers)
    data = probe.data(_labels(B, T))
    assert sorted(map(tuple, data.heads.tolist())) == [(l, h) for l in range(L) for h in range(H)]
    assert data.has_phantom == (sink is not None)
    assert data.has_value_norms == (kind != "weights_only")
    for l, layer in layers.items():
        for h in range(H):
            for b in range(B):
                got = data.dense(b, l, h)
                ref = np.where(layer.a[b, h] >= THRESHOLD, layer.a[b, h], 0.0)
                np.testing.assert_allclose(got, ref, atol=SCALE / 2 + 1e-6, rtol=0)
                k = int(np.flatnonzero((data.heads[:, 0] == l) & (data.heads[:, 1] == h))[0])
                np.testing.assert_allclose(data.phantom[b, k], layer.phi[b, h], atol=1e-5)
                if kind != "weights_only":
                    norms = np.linalg.norm(layer.v[b, h // layer.groups], axis=-1)
                    np.testing.assert_allclose(data.value_norms[b, k], norms, rtol=1e-5)
        p0 = (layer.w[..., 0])[:, :, 1:].mean(axis=(0, 2))  # (H,): w_q0 over q >= 1 and windows
        np.testing.assert_allclose(data.p0[l], p0, rtol=1e-5)


def test_dropped_weights_are_those_below_the_threshold():
    """A sharp head has many weights under 1e-3: none of them is kept, every other one is."""
    layer = make_layer(0, B=1, H=2, T=40, seed=3, sink_strength=np.array([9.0, 0.0]))
    probe = Explorer(spec(n_layers=1, n_heads=2), heads="all")
    probe.attention(0, layer.record)
    data = probe.data(_labels(1, 40))
    a = layer.a[0, 0]
    assert ((a > 0) & (a < THRESHOLD)).any()  # the case is exercised
    start, stop = data.blocks[0, 0]
    assert stop - start == int((a >= THRESHOLD).sum())


def test_auto_keeps_the_top_heads_by_p0_and_a_seeded_sample():
    """``none`` records every head's p0 and keeps no pattern; choose_heads then takes 8 top + 4 sampled."""
    L, H = 4, 4  # 16 heads: 8 top + 4 sampled
    strengths = {l: np.linspace(0.0, 3.0, H) + l for l in range(L)}  # p0 grows with the layer and the head
    layers = {l: make_layer(l, B=1, H=H, T=10, seed=l, sink_strength=strengths[l]) for l in range(L)}
    first = Explorer(spec(n_layers=L, n_heads=H), heads="none")
    _run(first, layers)
    assert first.data(_labels(1, 10)) is None and not np.isnan(first.p0()).any()
    p0 = first.p0()
    chosen = choose_heads(p0, seed=7)
    sampled = [key for key, why in chosen.items() if why == "sample"]
    tops = [key for key, why in chosen.items() if why == "top"]
    assert len(sampled) == AUTO_SAMPLE and len(tops) == AUTO_TOP
    best = sorted((k for k in np.ndindex(L, H) if k not in sampled), key=lambda k: -p0[k])[:AUTO_TOP]
    assert tops == best  # highest first: the page's order
    assert choose_heads(p0, seed=7) == chosen
    assert [k for k, _ in choose_heads(p0, seed=8).items() if _ == "sample"] != sampled
    second = Explorer(spec(n_layers=L, n_heads=H), heads=",".join(f"{l}.{h}" for l, h in chosen))
    _run(second, {l: make_layer(l, B=1, H=H, T=10, seed=l, sink_strength=strengths[l]) for l in range(L)})
    data = second.data(_labels(1, 10), chosen)
    assert [tuple(x) for x in data.heads.tolist()] == list(chosen) and list(data.chosen) == list(chosen.values())


def test_auto_in_one_pass_keeps_the_heads_choose_heads_takes_and_only_their_rows():
    """Issue 56, item 2: ``auto`` ranks the heads as the layers arrive (a running top set; a head pushed out has its
    rows dropped) and ends with choose_heads's heads on the same p0, their patterns equal to the named-head run's."""
    L, H = 4, 4
    strengths = {l: np.linspace(3.0, 0.0, H) + (L - l) for l in range(L)}  # early layers first: later ones push out
    make = lambda: {l: make_layer(l, B=2, H=H, T=10, seed=l, sink_strength=strengths[l], fused=True)  # noqa: E731
                    for l in range(L)}
    probe = Explorer(spec(n_layers=L, n_heads=H), heads="auto", seed=7)
    held = []
    for l, layer in make().items():
        probe.attention(l, layer.record)
        held.append(len(probe.patterns) + len(probe.deferred))
    assert not probe.patterns  # fused records: the candidates' records are held, no pattern is read yet
    probe.end_batch()
    chosen = choose_heads(probe.p0(), seed=7)
    assert probe.chosen() == chosen and list(probe.chosen()) == list(chosen)
    assert set(probe.patterns) == set(chosen) and max(held) <= AUTO_TOP + AUTO_SAMPLE
    named = Explorer(spec(n_layers=L, n_heads=H), heads=",".join(f"{l}.{h}" for l, h in chosen))
    _run(named, make())
    a, b = probe.data(_labels(2, 10), probe.chosen()), named.data(_labels(2, 10), chosen)
    np.testing.assert_array_equal(a.heads, b.heads)
    np.testing.assert_array_equal(a.keys, b.keys)
    assert np.abs(a.codes.astype(int) - b.codes.astype(int)).max() <= 1  # one head's matmul against several heads'
    np.testing.assert_allclose(a.phantom, b.phantom, atol=1e-6)
    np.testing.assert_allclose(a.value_norms, b.value_norms, rtol=1e-6)
    # a later batch keeps the final set's patterns, whatever its own p0 says
    later = make_layer(0, B=1, H=H, T=10, seed=9, sink_strength=np.linspace(0.0, 9.0, H))
    probe.batch_start = 2
    probe.attention(0, later.record)
    assert set(probe.patterns) == set(chosen)


def test_windows_reads_only_the_first_windows_of_the_run():
    """``windows=3``: of a batch of 4 starting at window 2 only the first window is read (the record is cut), and a
    batch past it is not read at all."""
    layer = make_layer(0, B=4, H=4, T=8, seed=2)
    probe = Explorer(spec(n_layers=1, n_heads=4), heads="all", windows=3)
    probe.batch_start = 2
    probe.attention(0, layer.record)
    assert {w for windows in probe.patterns.values() for w in windows} == {2}
    assert probe.p0_count[0, 0] == 1 * 7  # one window, queries 1..7
    whole = Explorer(spec(n_layers=1, n_heads=4), heads="all")
    whole.attention(0, layer.record.first_windows(1))  # the same window, cut by the record itself
    np.testing.assert_allclose(probe.p0(), whole.p0())
    probe.batch_start = 6
    probe.attention(0, layer.record)
    assert probe.p0_count[0, 0] == 7


def test_choose_heads_skips_layers_without_attention():
    p0 = np.array([[0.9, 0.8], [np.nan, np.nan], [0.1, 0.2]])
    chosen = choose_heads(p0, seed=0)
    assert set(chosen) == {(0, 0), (0, 1), (2, 0), (2, 1)}  # fewer heads than 8 + 4: all of them


def test_named_heads_only():
    layers = {l: make_layer(l, B=1, T=8, seed=l) for l in range(2)}
    probe = Explorer(spec(n_layers=2), heads="1.3,0.0")
    _run(probe, layers)
    data = probe.data(_labels(1, 8))
    assert sorted(map(tuple, data.heads.tolist())) == [(0, 0), (1, 3)]
    assert set(data.chosen) == {"asked"}
    assert not np.isnan(data.p0).any()  # every head's p0 is still recorded for the grid


def test_query_blocks_give_the_entries_of_one_block(monkeypatch):
    layer = make_layer(0, B=2, T=30, seed=11, fused=True)
    whole = Explorer(spec(n_layers=1), heads="all")
    whole.attention(0, layer.record)
    monkeypatch.setattr(explorer_mod, "BLOCK_BYTES", 4 * 2 * 4 * 30 * 7)  # 7 queries per block
    blocked = Explorer(spec(n_layers=1), heads="all")
    blocked.attention(0, make_layer(0, B=2, T=30, seed=11, fused=True).record)
    a, b = whole.data(_labels(2, 30)), blocked.data(_labels(2, 30))
    np.testing.assert_array_equal(a.keys, b.keys)
    assert np.abs(a.codes.astype(int) - b.codes.astype(int)).max() <= 1  # float32 round-off of another matmul shape
    np.testing.assert_array_equal(a.indptr, b.indptr)


def test_a_rolled_back_batch_leaves_nothing():
    probe = Explorer(spec(n_layers=1), heads="all")
    saved = probe.snapshot()
    probe.attention(0, make_layer(0, B=1, T=8).record)
    probe.restore(saved)
    assert probe.data(_labels(1, 8)) is None


@pytest.mark.parametrize("kind", ["explicit", "weights_only"])
def test_stored_weights_are_within_half_a_code_of_the_weights_given(kind):
    """The guarantee docs/explorer.md states: each kept weight is within scale / 2 (7.6e-6) of the float32
    weight the record holds (the model's own precision), with nothing added; an exact reference adds the
    record's float32 rounding on top (test_kept_patterns_equal_the_reference's + 1e-6)."""
    layer = make_layer(0, B=2, H=4, T=16, seed=31, weights_only=kind == "weights_only")
    probe = Explorer(spec(n_layers=1, n_heads=4), heads="all")
    probe.attention(0, layer.record)
    data = probe.data(_labels(2, 16))
    given = layer.record.weights.double().numpy()  # (B, H, T, T) float32 weights, as the model computed them
    for b in range(2):
        for h in range(4):
            kept = given[b, h] >= THRESHOLD
            error = np.abs(data.dense(b, 0, h) - given[b, h])[kept]
            assert error.max() <= SCALE / 2 * (1 + 1e-9)
