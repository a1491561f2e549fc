"""The results table as a pandas user reads it (SPEC.md "Tables"; issue 61, item 8).

``layer`` and ``head`` are whole numbers with empty cells where they do not apply: written ``3`` (never
``3.0``) in results.csv, int64 with nulls in results.parquet, and read back as pandas' nullable
``Int64`` by ``read_results`` from either file. A ``layer_type`` row's ``n`` follows its metric's
model row: the shared windows kept, pooled units (heads) added.
"""

from __future__ import annotations

import csv
import math

import numpy as np
import pandas as pd
import pyarrow.parquet as pq

from sinkscope.store.results import Row, layer_type_rows, read_results, rows_to_frame, write_tables

ROWS = [
    Row("p0_mass", "p0_mass", 0, 0, 0.25, 16, se=0.01),
    Row("p0_mass", "p0_mass", 0, 1, 0.5, 16, se=0.02),
    Row("p0_mass", "p0_mass", 0, None, 0.375, 16, se=0.015),
    Row("p0_mass", "p0_mass", 11, None, 0.125, 16, se=0.005),
    Row("p0_mass", "p0_mass", None, None, 0.25, 16, se=0.008),
    Row("p0_mass", "sink_head_share", 0, None, 0.5, 2, (("threshold", 0.5),)),
    Row("massive_activation", "massive_activation", 3, None, 120.0, 16),
]


def _written(tmp_path) -> pd.DataFrame:
    frame = rows_to_frame(ROWS)
    write_tables(tmp_path, frame, {"format_version": 1}, np.zeros((1, 2), dtype=np.int64))
    return frame


def test_the_frame_has_nullable_integer_layer_and_head():
    frame = rows_to_frame(ROWS)
    assert str(frame["layer"].dtype) == "Int64" and str(frame["head"].dtype) == "Int64"
    assert frame["head"].isna().tolist() == [False, False, True, True, True, True, True]
    assert frame["layer"].isna().sum() == 1


def test_the_csv_writes_whole_numbers_and_empty_cells(tmp_path):
    _written(tmp_path)
    with open(tmp_path / "results.csv", newline="", encoding="utf-8") as handle:
        records = list(csv.DictReader(handle))
    assert [r["layer"] for r in records] == ["0", "0", "0", "11", "", "0", "3"]
    assert [r["head"] for r in records] == ["0", "1", "", "", "", "", ""]
    assert all(r["n"] in ("16", "2") for r in records)
    assert not any(r[c].endswith(".0") for r in records for c in ("layer", "head", "n"))


def test_the_parquet_file_stores_int64_with_nulls(tmp_path):
    _written(tmp_path)
    schema = pq.read_schema(tmp_path / "results.parquet")
    assert str(schema.field("layer").type) == "int64" and str(schema.field("head").type) == "int64"
    table = pq.read_table(tmp_path / "results.parquet")
    assert table.column("head").null_count == 5 and table.column("layer").null_count == 1
    plain = pd.read_parquet(tmp_path / "results.parquet")  # pandas alone gets the nullable dtype back
    assert str(plain["layer"].dtype) == "Int64" and str(plain["head"].dtype) == "Int64"


def test_read_results_returns_int64_from_either_file(tmp_path):
    frame = _written(tmp_path)
    both = read_results(tmp_path)
    (tmp_path / "results.parquet").unlink()
    csv_only = read_results(tmp_path)
    for table in (both, csv_only):
        assert str(table["layer"].dtype) == "Int64" and str(table["head"].dtype) == "Int64"
        assert table["layer"].tolist()[:4] == [0, 0, 0, 11] and table["layer"].isna().tolist()[4]
        pd.testing.assert_series_equal(table["head"], frame["head"], check_names=True)
        np.testing.assert_allclose(table["se"].to_numpy(dtype=float), [r.se for r in ROWS], equal_nan=True)
    layer_rows = csv_only[csv_only["layer"].notna() & csv_only["head"].isna()]  # how the docs select them
    assert layer_rows["layer"].astype(int).tolist() == [0, 11, 0, 3]


def test_pandas_read_csv_gets_integers_when_told(tmp_path):
    _written(tmp_path)
    table = pd.read_csv(tmp_path / "results.csv", dtype={"layer": "Int64", "head": "Int64"})  # SPEC.md "Tables"
    assert table["head"].tolist()[:2] == [0, 1] and table["head"].isna().sum() == 5


def test_a_layer_type_row_keeps_shared_windows_and_adds_pooled_heads():
    windows = [4, 4, None]  # layers 0 and 1 sliding, layer 2 full
    rows = [Row("p0_mass", "p0_mass", layer, None, 0.2 + layer / 10, 16, se=0.01) for layer in range(3)]
    rows += [Row("p0_mass", "p0_mass", None, None, 0.3, 16, se=0.007)]
    rows += [Row("p0_mass", "sink_head_share", layer, None, 0.25, 4) for layer in range(3)]
    rows += [Row("p0_mass", "sink_head_share", None, None, 0.25, 12)]
    got = {(r.metric, dict(r.conditions)["layer_type"]): r for r in layer_type_rows(rows, windows)}
    assert got[("p0_mass", "sliding")].n == got[("p0_mass", "full")].n == 16  # the windows every layer shares
    assert got[("sink_head_share", "sliding")].n == 8 and got[("sink_head_share", "full")].n == 4  # their heads
    assert got[("p0_mass", "sliding")].value == 0.25
    assert all(math.isnan(r.se) and r.layer is None and r.head is None for r in got.values())
