"""``--loader transformer-lens`` (run/hooked_loader.py): the options' sentences, and TransformerLens 4's.

The HookedTransformer it builds is checked against the model as it is in
tests/integration/test_hooked_transformer.py (TransformerLens 3 from ``make tl3-deps``).
"""

from __future__ import annotations

import pytest
from typer.testing import CliRunner

from sinkscope.capture.hooked import PROCESSING, processing_options
from sinkscope.cli import app
from sinkscope.errors import SinkscopeError
from sinkscope.run.hooked_loader import load_hooked


def _has_hooked_transformer() -> bool:
    try:
        from transformer_lens import HookedTransformer  # noqa: F401
    except ImportError:
        return False
    return True


def test_processing_options_default_to_from_pretrained_and_take_true_or_false():
    assert processing_options(()) == PROCESSING and PROCESSING["fold_ln"] and not PROCESSING["refactor_factored_attn_matrices"]
    assert processing_options(["fold_ln=false", "center-unembed=0"]) == {**PROCESSING, "fold_ln": False,
                                                                         "center_unembed": False}
    for bad in ("fold_ln", "fold=1", "fold_ln=maybe"):
        with pytest.raises(SinkscopeError, match="KEY=true|false"):
            processing_options([bad])


@pytest.mark.parametrize("args, words", [
    (["--loader", "lens"], "unknown --loader 'lens'"),
    (["--loader-option", "fold_ln=false"], "goes with --loader transformer-lens"),
    (["--loader", "transformer-lens", "--loader-option", "fold=1"], "KEY=true|false"),
    (["--loader", "transformer-lens", "--device-map", "auto"], "drop --device-map"),
])
def test_loader_mistakes_are_one_sentence_before_anything_loads(tiny_llama_dir, tmp_path, args, words):
    result = CliRunner().invoke(app, ["sinks", str(tiny_llama_dir), *args, "--out", str(tmp_path / "run")])
    assert result.exit_code != 0 and words in result.output and "Traceback" not in result.output, result.output
    assert not (tmp_path / "run").exists()


@pytest.mark.skipif(_has_hooked_transformer(), reason="TransformerLens 3 is installed here")
def test_transformer_lens_4_is_one_sentence_naming_the_version_that_has_hooked_transformer(tiny_llama_dir, tmp_path):
    result = CliRunner().invoke(app, ["sinks", str(tiny_llama_dir), "--loader", "transformer-lens", "--no-figures",
                                      "--seq-len", "16", "--n-seqs", "2", "--out", str(tmp_path / "run")])
    assert result.exit_code == 1 and "Traceback" not in result.output
    assert "TransformerLens 4 removed" in result.output and "transformer-lens>=3,<4" in result.output


def test_a_trainer_checkpoint_is_measured_as_it_is():
    from sinkscope.models.resolve import Source

    with pytest.raises(SinkscopeError, match="trainer checkpoint is measured as it is"):
        load_hooked(Source(kind="checkpoint", location="ckpt", path="ckpt"), device="cpu", dtype="float32", loader_option=(),
                    trust_remote_code=False, tokenizer=None, log=print)
