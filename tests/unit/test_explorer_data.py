"""``explorer_data.py``: the explorer's file, the page's block layout, the budget and ``--explore-heads``.

Checked: ``explorer.npz`` reads back equal (no pickle) and a damaged one is one sentence; a block
inflates to exactly the little-endian layout ``explorer.js`` reads (int32 indptr, float32 value
norms and phantom, uint32 keys, uint16 codes), independently decoded here with numpy; ``fit``
keeps a prefix of window 0's heads first within the byte budget and names what it left out;
``parse_heads`` and ``check_heads_exist`` accept auto/all/none/L.H and refuse the rest in one
sentence.
"""

from __future__ import annotations

import base64
import zlib

import numpy as np
import pytest

from sinkscope.errors import SinkscopeError
from explorer_fixtures import synthetic
from sinkscope.explorer_data import SCALE, ExplorerData, check_heads_exist, fit, labels_bytes, parse_heads


def test_the_file_reads_back_equal(tmp_path):
    data = synthetic()
    data.save(tmp_path / "explorer.npz")
    back = ExplorerData.load(tmp_path / "explorer.npz")
    for name in ("heads", "chosen", "windows", "labels", "blocks", "indptr", "keys", "codes", "value_norms",
                 "phantom", "p0"):
        np.testing.assert_array_equal(getattr(back, name), getattr(data, name))
    assert back.has_phantom and back.has_value_norms and back.scale == SCALE
    np.testing.assert_array_equal(back.dense(5, 2, 0), data.dense(5, 2, 0))


@pytest.mark.parametrize("damage", ["truncated", "not npz", "shapes"])
def test_a_damaged_file_is_one_sentence(tmp_path, damage):
    path = tmp_path / "explorer.npz"
    data = synthetic()
    if damage == "shapes":
        data.indptr = data.indptr[:, :, :-2]
    data.save(path)
    if damage == "truncated":
        path.write_bytes(path.read_bytes()[:200])
    elif damage == "not npz":
        path.write_text("hello")
    with pytest.raises(SinkscopeError, match=r"the explorer data at .* is damaged .*; rerun the measurement\."):
        ExplorerData.load(path)


def test_a_block_is_the_layout_the_page_reads():
    data = synthetic(T=16)
    w, k = 1, 2
    raw = zlib.decompress(base64.b64decode(data.block_text(w, k)))
    T = 16
    start, stop = data.blocks[w, k]
    n = int(stop - start)
    assert len(raw) == 4 * (T + 1) + 4 * T + 4 * T + 4 * n + 2 * n
    at = 0
    indptr = np.frombuffer(raw, "<i4", T + 1, at); at += 4 * (T + 1)
    norms = np.frombuffer(raw, "<f4", T, at); at += 4 * T
    phantom = np.frombuffer(raw, "<f4", T, at); at += 4 * T
    keys = np.frombuffer(raw, "<u4", n, at); at += 4 * n
    codes = np.frombuffer(raw, "<u2", n, at)
    np.testing.assert_array_equal(indptr, data.indptr[w, k])
    np.testing.assert_array_equal(norms, data.value_norms[w, k])
    np.testing.assert_array_equal(phantom, data.phantom[w, k])
    dense = np.zeros((T, T))
    for q in range(T):
        dense[q, keys[indptr[q]:indptr[q + 1]]] = codes[indptr[q]:indptr[q + 1]] * SCALE
    np.testing.assert_array_equal(dense, data.dense(5, 1, 3))


def test_fit_keeps_window_zeros_heads_first_within_the_budget():
    data = synthetic(W=2, K=3)
    full, used_all = fit(data, None)
    assert len(full.kept()) == 6 and not full.left_out
    sizes = [len(data.block_text(w, k)) + 64 for w, k in data.kept()]
    budget = labels_bytes(data) + sum(sizes[:4]) + 10  # room for four patterns
    kept, used = fit(data, budget)
    assert kept.kept() == [(0, 0), (0, 1), (0, 2), (1, 0)]
    assert used <= budget and used == labels_bytes(data) + sum(sizes[:4])
    assert kept.left_out == [(5, 2, 0), (5, 1, 3)]  # (window row, layer, head)
    np.testing.assert_array_equal(kept.dense(0, 1, 3), data.dense(0, 1, 3))  # what is kept is unchanged
    np.testing.assert_array_equal(kept.dense(5, 0, 1), data.dense(5, 0, 1))
    with pytest.raises(SinkscopeError, match="holds no pattern for window 5, layer 2, head 0"):
        kept.dense(5, 2, 0)
    assert used_all > used


@pytest.mark.parametrize("value, expected", [
    ("auto", ("auto", ())), ("ALL", ("all", ())), ("none", ("none", ())),
    ("3.1,5.0", ("asked", ((3, 1), (5, 0)))), (" 0.0 , 0.0", ("asked", ((0, 0),))),
])
def test_explore_heads_values(value, expected):
    assert parse_heads(value) == expected


@pytest.mark.parametrize("value", ["3", "top", "1.x", "1.2,", "-1.0"])
def test_a_malformed_explore_heads_is_one_sentence(value):
    with pytest.raises(SinkscopeError, match="takes auto, all, none or LAYER.HEAD pairs"):
        parse_heads(value)


def test_a_head_the_model_lacks_is_one_sentence():
    check_heads_exist("1.2", 3, 4, (0, 1, 2))
    with pytest.raises(SinkscopeError, match="names layer 1 head 4, which the model does not have"):
        check_heads_exist("1.4", 3, 4, (0, 1, 2))
    with pytest.raises(SinkscopeError, match="names layer 1 head 0"):
        check_heads_exist("1.0", 3, 4, (0, 2))  # layer 1 has no attention (a hybrid model)
