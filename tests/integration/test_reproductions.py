"""The published results' protocols through ``sinks``, on a tiny Llama folder.

Checked: ``--inputs random`` evaluates exactly the ids ``corpus.synthetic_windows`` draws with the
run's seed (recorded in the manifest), ``repeated`` one id per window; ``--inputs`` with a text file
is one sentence; and one ``sinks`` run gives both numbers of the third-party audit: the sink mass
(``p0_mass``'s model row) and "heads > 0.5" (``sink_head_share``, the share of per-head p0_mass
above 0.5), with ``--sink-first-query 1`` adding the audit's sink rate (a ``first_query`` column).
"""

from __future__ import annotations

import json

import numpy as np
from typer.testing import CliRunner

from sinkscope.cli import app
from sinkscope.data.corpus import synthetic_windows
from sinkscope.store.results import read_results


def sinks(folder, out, *args):
    result = CliRunner().invoke(app, ["sinks", str(folder), "--out", str(out), "--no-progress", "--no-figures",
                                      "--explore-windows", "0", *map(str, args)])
    return result


def test_random_inputs_are_the_drawn_ids(tiny_llama_dir, tokenizer, tmp_path):
    result = sinks(tiny_llama_dir, tmp_path / "random", "--inputs", "random", "--seq-len", 32, "--n-seqs", 5,
                   "--seed", 3, "--bos", "add")
    assert result.exit_code == 0, result.output
    tokens = np.load(tmp_path / "random" / "tokens.npy")
    expected, record = synthetic_windows("random", len(tokenizer), set(tokenizer.all_special_ids), seq_len=32,
                                         n_seqs=5, seed=3, bos_id=tokenizer.bos_token_id)
    assert (tokens == expected.tokens).all()
    manifest = json.loads((tmp_path / "random" / "manifest.json").read_text())
    assert manifest["windows"]["inputs"] == record and manifest["corpus"]["kind"] == "random tokens"


def test_repeated_inputs_repeat_one_token(tiny_llama_dir, tmp_path):
    result = sinks(tiny_llama_dir, tmp_path / "repeated", "--inputs", "repeated", "--seq-len", 16, "--n-seqs", 3,
                   "--bos", "none")
    assert result.exit_code == 0, result.output
    tokens = np.load(tmp_path / "repeated" / "tokens.npy")
    assert (tokens == tokens[:, :1]).all() and len(set(tokens[:, 0])) > 1


def test_inputs_with_a_text_file_is_one_sentence(tiny_llama_dir, text_file, tmp_path):
    result = sinks(tiny_llama_dir, tmp_path / "x", "--inputs", "random", "--text-file", text_file)
    assert result.exit_code == 1 and "--inputs random draws its own token ids" in result.output
    assert "Traceback" not in result.output


def test_one_sinks_run_gives_the_audits_two_numbers(tiny_llama_dir, text_file, tmp_path):
    result = sinks(tiny_llama_dir, tmp_path / "audit", "--text-file", text_file, "--seq-len", 32, "--n-seqs", 4,
                   "--sink-first-query", 1, "--sink-epsilon", 0.5)
    assert result.exit_code == 0, result.output
    table = read_results(tmp_path / "audit")
    p0 = table[table.metric == "p0_mass"]
    per_head = p0[p0["head"].notna()]["value"].to_numpy()
    share = table[(table.metric == "sink_head_share") & table.layer.isna()]
    assert share["value"].item() == (per_head > 0.5).mean() and share["threshold"].item() == 0.5
    assert p0[p0.layer.isna()]["value"].item() > 0
    rate = table[table.metric == "sink_rate"]
    assert (rate["first_query"] == 1).all()
