"""``store/explorer_format.py``: the explorer's file, the page's block layout, the budget and ``--explore-heads``.

Checked: ``explorer.npz`` reads back equal (no pickle) and a damaged one is one sentence; a block
inflates to exactly the little-endian layout ``explorer.js`` reads (int32 indptr, float32 value
norms and phantom, uint32 keys, uint16 codes), independently decoded here with numpy; ``fit``
keeps a prefix of window 0's heads first within the byte budget and names what it left out;
``parse_heads`` and ``check_heads_exist`` accept auto/all/none/L.H and refuse the rest in one
sentence; ``choose_heads`` draws auto's sample first, then the top heads of the rest.
"""

from __future__ import annotations

import base64
import zlib

import numpy as np
import pytest

from sinkscope.errors import SinkscopeError
from explorer_fixtures import synthetic
from sinkscope.store.explorer_format import (
    AUTO_SAMPLE,
    AUTO_TOP,
    SCALE,
    ExplorerData,
    check_heads_exist,
    choose_heads,
    fit,
    labels_bytes,
    parse_heads,
)


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


# ---- a planted file is checked before it is read (issue 60) -----------------------------------------------------

import io  # noqa: E402
import math  # noqa: E402
import tracemalloc  # noqa: E402
import zipfile  # noqa: E402

from sinkscope.store.explorer_format import MEMBERS, check_max_mb, read_npy  # noqa: E402


def _member(array: np.ndarray) -> bytes:
    buffer = io.BytesIO()
    np.lib.format.write_array(buffer, array, allow_pickle=True)
    return buffer.getvalue()


def _header(shape: tuple, descr: str = "<u2") -> bytes:
    """An npy header alone (version 1.0) declaring ``shape``."""
    text = "{'descr': '%s', 'fortran_order': False, 'shape': %r, }" % (descr, shape)
    head = b"\x93NUMPY\x01\x00"
    body = text.encode("latin1")
    body += b" " * (64 - (len(head) + 2 + len(body) + 1) % 64) + b"\n"
    return head + len(body).to_bytes(2, "little") + body


def _plant(path, data, **members: bytes) -> None:
    """``data``'s explorer.npz with some members' bytes replaced (deflated, as a planted file would be)."""
    data.save(path)
    with zipfile.ZipFile(path) as archive:
        original = {name: archive.read(name) for name in archive.namelist()}
    with zipfile.ZipFile(path, "w", compression=zipfile.ZIP_DEFLATED) as archive:
        for name, raw in original.items():
            archive.writestr(name, members.get(name[:-4], raw))


def _refused(path, manifest=None) -> str:
    tracemalloc.start()
    try:
        with pytest.raises(SinkscopeError) as error:
            ExplorerData.load(path, manifest)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 8 << 20, f"{peak:,} bytes read before the refusal"
    message = str(error.value)
    assert message.startswith(f"the explorer data at {path} is damaged (") and message.count(". ") == 0
    return message


def test_a_member_that_inflates_past_its_header_is_refused_unread(tmp_path):
    """64 MB of zeros after a small header: the zip entry's size is not what the header declares."""
    path = tmp_path / "explorer.npz"
    _plant(path, synthetic(), codes=_header((10,)) + bytes(64 << 20))
    assert path.stat().st_size < 1 << 20
    assert "inflates to 67,108,9" in _refused(path)


def test_a_member_declaring_more_entries_than_its_windows_hold_is_refused_unread(tmp_path):
    """Consistent 16 MB and 8 MB members (headers and sizes agree): more entries than 2 windows x 3 heads x 16 tokens hold."""
    path = tmp_path / "explorer.npz"
    n = 4 << 20
    _plant(path, synthetic(), keys=_header((n,), "<i4") + bytes(4 * n), codes=_header((n,)) + bytes(2 * n))
    assert "more than 2 windows of 3 heads can hold" in _refused(path)


def test_a_header_declaring_a_trillion_elements_is_one_sentence(tmp_path):
    path = tmp_path / "explorer.npz"
    _plant(path, synthetic(), codes=_header((10**12,)) + bytes(100))
    assert "its member codes inflates to" in _refused(path)
    _plant(path, synthetic(), labels=_header((10**6, 10**6), "<U4") + bytes(100))
    _refused(path)


def test_an_object_member_is_never_unpickled(tmp_path):
    path = tmp_path / "explorer.npz"
    _plant(path, synthetic(), chosen=_member(np.array([print, print, print], dtype=object)))
    assert "object" in _refused(path)


@pytest.mark.parametrize("meta", [[math.nan, SCALE, 1, 1], [1e-3, math.inf, 1, 1], [-1, SCALE, 0, 1]])
def test_metadata_that_is_not_finite_is_one_sentence(tmp_path, meta):
    path = tmp_path / "explorer.npz"
    _plant(path, synthetic(), meta=_member(np.array(meta, dtype=np.float64)))
    assert "not a number in" in _refused(path)


def test_wrong_typed_members_are_one_sentence(tmp_path):
    path = tmp_path / "explorer.npz"
    _plant(path, synthetic(), meta=_member(np.array(["a", "b", "c", "d"])))
    assert "member meta is <U1" in _refused(path)
    _plant(path, synthetic(), heads=_member(np.array([[0, 1], [2, 0], [9, 3]], np.int32)))
    assert "outside the model's layers" in _refused(path)


def test_a_file_the_manifest_does_not_allow_is_one_sentence(tmp_path):
    path = tmp_path / "explorer.npz"
    synthetic().save(path)
    manifest = {"windows": {"seq_len": 16, "n_seqs": 8}, "model": {"spec": {"n_layers": 3, "n_heads": 4}},
                "explorer": {"heads": [[0, 1], [2, 0], [1, 3]], "windows": [0, 5]}}
    ExplorerData.load(path, manifest)  # what the run wrote
    assert "but the run's manifest says 1" in _refused(path, {**manifest, "explorer": {**manifest["explorer"],
                                                                                  "windows": [0]}})
    assert "but the run's manifest says 8" in _refused(path, {**manifest, "windows": {"seq_len": 8, "n_seqs": 8}})
    assert "records no explorer" in _refused(path, {"windows": manifest["windows"]})
    (tmp_path / "manifest.json").write_text('{"windows": {"seq_len": 32, "n_seqs": 2}, "explorer": {"windows": [0, 5]}}')
    assert "tokens per window" in _refused(path)  # the manifest beside the file


def test_tokens_npy_is_checked_before_it_is_read(tmp_path):
    path = tmp_path / "tokens.npy"
    np.save(path, np.arange(12, dtype=np.int64).reshape(3, 4))
    np.testing.assert_array_equal(read_npy(path, (3, 4), "iu", "the token ids"), np.arange(12).reshape(3, 4))
    with pytest.raises(ValueError, match=r"its shape is \(3, 4\), but the run's manifest says \(2, 4\)"):
        read_npy(path, (2, 4), "iu", "the token ids")
    path.write_bytes(_header((10**6, 10**6), "<i8") + bytes(64))
    with pytest.raises(ValueError, match="not the 8,000,000,000,128 its header declares"):
        read_npy(path, None, "iu", "the token ids")
    path.write_bytes(_member(np.array([print], dtype=object)))
    with pytest.raises(ValueError, match="holds object values"):
        read_npy(path, None, "iu", "the token ids")


def test_every_member_is_listed():
    assert set(MEMBERS) == {"heads", "chosen", "windows", "labels", "blocks", "indptr", "keys", "codes", "value_norms",
                            "phantom", "p0", "meta"}


@pytest.mark.parametrize("value", [math.inf, -math.inf, math.nan, -1, 0, "inf", "x", True])
def test_explore_max_mb_must_be_finite_and_positive(value):
    with pytest.raises(SinkscopeError, match="must be a finite number of MB above 0"):
        check_max_mb(value)


def test_explore_max_mb_accepts_numbers_and_none():
    assert check_max_mb(None) is None and check_max_mb(2) == 2.0 and check_max_mb(0.5) == 0.5


@pytest.mark.parametrize("value", ["².1", "1.²", "٣.1", "1.1_0", "+1.0", "1 .0", "1234567890.0"])
def test_explore_heads_takes_ascii_digits_only(value):
    with pytest.raises(SinkscopeError, match="takes auto, all, none or LAYER.HEAD pairs"):
        parse_heads(value)


def test_auto_draws_its_sample_first_then_the_top_heads_of_the_rest():
    """SPEC.md "The explorer" and docs/explorer.md: AUTO_SAMPLE heads drawn with the seed, then the AUTO_TOP others
    of highest p0, so a drawn head may be one of the highest (not "the top 8 plus 4 drawn from the rest")."""
    p0 = np.arange(4 * 9, dtype=float).reshape(4, 9) / 36  # 36 heads, p0 rising with (layer, head)
    by_p0 = sorted(np.ndindex(4, 9), key=lambda key: -p0[key])
    for seed in range(200):
        chosen = choose_heads(p0, seed)
        sampled = {key for key, why in chosen.items() if why == "sample"}
        if sampled & set(by_p0[:AUTO_TOP]):  # a drawn head among the 8 highest
            break
    else:
        pytest.fail("no seed in 200 draws a top head")
    tops = [key for key, why in chosen.items() if why == "top"]
    assert len(sampled) == AUTO_SAMPLE and len(tops) == AUTO_TOP
    assert tops == [key for key in by_p0 if key not in sampled][:AUTO_TOP]  # the 8 highest of the rest
    assert tops != by_p0[:AUTO_TOP]

