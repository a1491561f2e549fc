"""The stream section's quantised-cache figure and names (report/stream_quant.py)."""

from __future__ import annotations

import numpy as np
import pandas as pd

from sinkscope.report import stream_quant


def _rows() -> pd.DataFrame:
    """stream_ppl model rows of one sinks condition: 16 bits, then 4 and 2 bits unprotected and with 4 exact."""
    base = dict(probe="stream", metric="stream_ppl", policy="sinks", cache=64, sink_tokens=4, positions="cache",
                position_bucket=np.nan, se=np.nan)
    rows = [dict(base, kv_bits=16, kv_group=np.nan, kv_scheme=None, protect_sinks=np.nan, protect=None, value=20.0)]
    for bits, plain, guarded in ((4, 22.0, 21.0), (2, 60.0, 30.0)):
        rows.append(dict(base, kv_bits=bits, kv_group=64, kv_scheme="kivi", protect_sinks=0, protect=None, value=plain))
        rows.append(dict(base, kv_bits=bits, kv_group=64, kv_scheme="kivi", protect_sinks=4, protect=None, value=guarded))
    rows.append(dict(base, kv_bits=2, kv_group=64, kv_scheme="kivi", protect_sinks=0, protect="top-p0:4", value=25.0))
    return pd.DataFrame(rows)


def test_settings_are_named_as_the_labels_name_them():
    rows = _rows()
    assert [stream_quant.setting(r) for _, r in rows.iterrows()] == [
        "", "4-bit kivi g64", "4-bit kivi g64, first 4 exact", "2-bit kivi g64", "2-bit kivi g64, first 4 exact",
        "2-bit kivi g64, top-p0:4 exact"]
    assert stream_quant.quantises(rows) and len(stream_quant.unquantised(rows)) == 1
    assert not stream_quant.quantises(rows[rows.kv_bits == 16])
    assert len({stream_quant.key(r) for _, r in rows.iterrows()}) == len(rows)


def test_the_bits_figure_draws_one_line_per_protection_from_the_16_bit_value():
    figure = stream_quant.ppl_by_bits(_rows(), "test", lambda row: "sinks 4+60")
    ax = figure.axes[0]
    lines = {line.get_label(): (list(line.get_xdata()), list(line.get_ydata())) for line in ax.get_lines()}
    assert [t.get_text() for t in ax.get_xticklabels()] == ["16", "4", "2"]
    assert lines["kivi g64, none"] == ([0, 1, 2], [20.0, 22.0, 60.0])
    assert lines["kivi g64, first 4 exact"] == ([0, 1, 2], [20.0, 21.0, 30.0])
    assert lines["kivi g64, top-p0:4 exact"] == ([0, 2], [20.0, 25.0])
    assert list(lines["16-bit"][1]) == [20.0, 20.0]  # the dashed reference


def test_the_p0_row_draws_the_sink_share_through_the_same_caches():
    rows = _rows()
    p0 = rows.assign(metric="stream_p0_mass", value=[0.40, 0.39, 0.40, 0.12, 0.38, 0.35])
    figure = stream_quant.ppl_by_bits(rows, "test", lambda row: "sinks 4+60", p0)
    assert len(figure.axes) == 2
    lines = {line.get_label(): list(line.get_ydata()) for line in figure.axes[1].get_lines()}
    assert lines["kivi g64, none"] == [0.40, 0.39, 0.12] and lines["kivi g64, first 4 exact"] == [0.40, 0.40, 0.38]
    assert figure.axes[1].get_ylabel() == "p0 mass through the cache"


def test_the_share_of_the_cache_quantised_reads_as_words():
    assert stream_quant.share_text(0.0) == "quantises nothing (rows = 16-bit)"
    assert stream_quant.share_text(0.6249) == "62% of the cache quantised"
    assert stream_quant.share_text(0.004) == "0.4% of the cache quantised"
