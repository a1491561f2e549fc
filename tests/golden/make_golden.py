"""Regenerate the golden run folders (tests/integration/test_golden.py compares fresh runs with them).

    .venv/bin/python tests/golden/make_golden.py

Each is a real `sinkscope sinks` run of a tiny model built from a config (tests/tiny_models.py)
on tests/golden/sample.txt, without figures (tests/e2e/test_report.py draws them). Regenerate only
when a change of the numbers is intended, and say so in the commit message: test_golden.py
holds every later run to these tables byte for byte.
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

FAMILIES = ("llama", "gpt_oss")


def sample_text() -> Path:
    """The committed sample text (written from conftest.SAMPLE_TEXT if missing)."""
    text = HERE / "sample.txt"
    if not text.is_file() or not text.read_text(encoding="utf-8"):
        text.write_text(SAMPLE_TEXT * 12, encoding="utf-8")
    return text


def make_run(family: str, out: Path) -> None:
    """One golden run of ``family`` into ``out`` (replaced)."""
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp) / f"tiny-{family}"
        build(family).save_pretrained(folder)
        make_tokenizer().save_pretrained(folder)
        shutil.rmtree(out, ignore_errors=True)
        result = CliRunner().invoke(app, ["sinks", str(folder), "--text-file", str(sample_text()), "--seq-len", "32",
                                          "--n-seqs", "6", "--out", str(out),
                                          "--no-figures", "--no-progress"])
        assert result.exit_code == 0, result.output


def main() -> None:
    for family in FAMILIES:
        out = HERE / f"run_tiny_{family}"
        make_run(family, out)
        print(out)


if __name__ == "__main__":
    main()
