"""Fresh `sinkscope sinks` runs equal the committed golden runs (1e-6; same rows, same order).

The golden folders (tests/golden/run_tiny_*) are produced by tests/golden/make_golden.py; a
change that moves any number fails here until the goldens are regenerated on purpose. The
tolerance, not byte equality, because float32 kernels differ in the last digits between CPUs.
"""

from __future__ import annotations

import json
import sys

import numpy as np
import pandas as pd
import pytest

from repo_paths import GOLDEN

sys.path.insert(0, str(GOLDEN))

import make_golden  # noqa: E402


@pytest.mark.parametrize("family", make_golden.FAMILIES)
def test_fresh_run_equals_the_golden_run(family, tmp_path):
    fresh = tmp_path / f"run_tiny_{family}"
    make_golden.make_run(family, fresh)
    golden = GOLDEN / f"run_tiny_{family}"
    fresh_table, golden_table = pd.read_csv(fresh / "results.csv"), pd.read_csv(golden / "results.csv")
    keys = ["probe", "metric", "layer", "head", "n"]
    pd.testing.assert_frame_equal(fresh_table[keys], golden_table[keys])
    np.testing.assert_allclose(fresh_table["value"], golden_table["value"], rtol=1e-6, atol=1e-6)
    assert (fresh / "tokens.npy").read_bytes() == (golden / "tokens.npy").read_bytes()
    fresh_manifest = json.loads((fresh / "manifest.json").read_text())
    golden_manifest = json.loads((golden / "manifest.json").read_text())
    assert fresh_manifest["windows"] == golden_manifest["windows"]
    assert fresh_manifest["model"]["spec"] == golden_manifest["model"]["spec"]
