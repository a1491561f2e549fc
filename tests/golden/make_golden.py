"""Regenerate the golden run folders (tests/integration/test_golden.py compares fresh runs with them).

    .venv/bin/python tests/golden/make_golden.py            # every golden run
    .venv/bin/python tests/golden/make_golden.py heads_llama  # one

Each is a real run of one measuring command (``sinks``, ``heads``, ``inject``, ``circuit``,
``selectivity``, ``stream``) on a tiny model built from a config (tests/tiny_models.py) or a
trainer checkpoint saved without training, on tests/golden/sample.txt, without figures
(tests/e2e/test_report.py draws them); ``sinks_smollm2`` runs the embedded SmolLM2. Regenerate
only when a change of the numbers is intended, and say so in the commit message: test_golden.py
holds every later run to these tables, byte for byte where the versions match.
"""

from __future__ import annotations

import shutil
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).parent
sys.path.insert(0, str(HERE.parent))

from typer.testing import CliRunner  # noqa: E402

from conftest import SAMPLE_TEXT, make_tokenizer  # noqa: E402
from sinkscope.cli import app
from tiny_models import build  # noqa: E402

COMMON = ["--no-figures", "--no-progress", "--device", "cpu"]
#: name -> (model: a tiny family, "normgate" (a trainer checkpoint) or None (SmolLM2), command and options)
RUNS: dict[str, tuple[str | None, list[str]]] = {
    "sinks_llama": ("llama", ["sinks", "--seq-len", "32", "--n-seqs", "6"]),
    "sinks_gpt_oss": ("gpt_oss", ["sinks", "--seq-len", "32", "--n-seqs", "6"]),
    "heads_llama": ("llama", ["heads", "--seq-len", "32", "--n-seqs", "4", "--ablate-dormant", "--dormant-below",
                              "0.95"]),
    "inject_llama": ("llama", ["inject", "--seq-len", "32", "--n-seqs", "4", "--eval-batch", "2", "--doses", "0.5,1"]),
    "circuit_llama": ("llama", ["circuit", "--seq-len", "32", "--n-seqs", "4"]),
    "selectivity_normgate": ("normgate", ["selectivity", "--seq-len", "32", "--n-seqs", "4", "--min-count", "3"]),
    "stream_llama": ("llama", ["stream", "--length", "48", "--n-seqs", "2", "--cache", "8", "--sink-tokens", "2",
                               "--chunk", "16", "--positions", "cache,original"]),
    "sinks_smollm2": (None, ["sinks", "--seq-len", "64", "--n-seqs", "2"]),
}
#: the runs the fast tier checks (SmolLM2's loads the real model: the slow tier).
TINY = tuple(name for name, (model, _) in RUNS.items() if model is not None)
#: the two runs from before the other commands had goldens (tests/e2e/test_report.py reads them).
LEGACY = {"sinks_llama": "run_tiny_llama", "sinks_gpt_oss": "run_tiny_gpt_oss"}


def sample_text() -> Path:
    """The committed sample text (written from conftest.SAMPLE_TEXT if missing)."""
    text = HERE / "sample.txt"
    if not text.is_file() or not text.read_text(encoding="utf-8"):
        text.write_text(SAMPLE_TEXT * 12, encoding="utf-8")
    return text


def folder_of(name: str) -> Path:
    """Where the golden run ``name`` is committed."""
    return HERE / LEGACY.get(name, f"run_{name}")


def _model(kind: str, folder: Path) -> Path:
    if kind == "normgate":
        import torch

        from sinkscope.train.checkpoint import save_checkpoint
        from sinkscope.models.trainer_config import GPTConfig
        from sinkscope.train.model import GPT

        tokenizer = make_tokenizer()
        torch.manual_seed(0)
        model = GPT(GPTConfig(vocab_size=len(tokenizer), block_size=64, n_layer=2, n_head=2, n_embd=32,
                              variant="normgate"))
        save_checkpoint(folder, model, None, step=0, train_state=None, tokenizer=tokenizer,
                        meta={"tier": "golden", "seed": 0})
    else:
        build(kind).save_pretrained(folder)
        make_tokenizer().save_pretrained(folder)
    return folder


def make_run(name: str, out: Path) -> None:
    """The golden run ``name`` into ``out`` (replaced)."""
    kind, args = RUNS[name]
    with tempfile.TemporaryDirectory() as tmp:
        model = [] if kind is None else [str(_model(kind, Path(tmp) / f"tiny-{kind}"))]
        text = [] if kind is None else ["--text-file", str(sample_text())]
        shutil.rmtree(out, ignore_errors=True)
        result = CliRunner().invoke(app, [args[0], *model, *args[1:], *text, "--out", str(out), *COMMON])
        assert result.exit_code == 0, result.output


def main(argv: list[str]) -> None:
    """``[--into DIR] [NAME ...]``: regenerate the goldens (or, with ``--into``, write fresh runs into DIR)."""
    into = None
    if argv[:1] == ["--into"]:
        into, argv = Path(argv[1]), argv[2:]
    for name in argv or RUNS:
        out = folder_of(name) if into is None else into / folder_of(name).name
        make_run(name, out)
        print(out)


if __name__ == "__main__":
    main(sys.argv[1:])
