"""Regenerate the golden run folders used by tests/test_report.py.

    .venv/bin/python tests/golden/make_golden.py

Each is a real `sinkscope sinks` run of a tiny model built from a config (tests/tiny_models.py)
on tests/golden/sample.txt, without figures (the report draws them).
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
from sinkscope.cli import app  # noqa: E402
from tiny_models import build  # noqa: E402


def main() -> None:
    text = HERE / "sample.txt"
    text.write_text(SAMPLE_TEXT * 12, encoding="utf-8")
    for family in ["llama", "gpt_oss"]:
        with tempfile.TemporaryDirectory() as tmp:
            folder = Path(tmp) / f"tiny-{family}"
            build(family).save_pretrained(folder)
            make_tokenizer().save_pretrained(folder)
            out = HERE / f"run_tiny_{family}"
            shutil.rmtree(out, ignore_errors=True)
            result = CliRunner().invoke(app, ["sinks", str(folder), "--text-file", str(text), "--seq-len", "32",
                                              "--n-seqs", "6", "--sink-layer-start", "1", "--out", str(out),
                                              "--no-figures", "--no-progress"])
            assert result.exit_code == 0, result.output
            print(out)


if __name__ == "__main__":
    main()
