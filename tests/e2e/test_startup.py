"""The command line answers help, listings and option mistakes without importing torch.

Measured once per process in a fresh interpreter: ``--help``, ``ls hooks``/``families``/``commands``
and an option mistake must not import torch or transformers (they take seconds to import), and
``report`` reads runs without them (DESIGN.md: the report reads tables, never a model).
"""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
from repo_paths import GOLDEN, REPO

SRC = str(REPO / "src")
TINY_LLAMA_RUN = GOLDEN / "run_tiny_llama"


def _imports(args: list[str], cwd=None) -> tuple[int, set[str], str]:
    """Run the CLI in a fresh interpreter; return (exit code, heavy modules imported, stderr)."""
    code = ("import sys, runpy\n"
            "sys.argv = ['sinkscope', *sys.argv[1:]]\n"
            "try:\n"
            "    from sinkscope.cli import app\n"
            "    app(prog_name='sinkscope')\n"
            "except SystemExit as e:\n"
            "    status = e.code if isinstance(e.code, int) else 0\n"
            "else:\n"
            "    status = 0\n"
            "heavy = [m for m in ('torch', 'transformers', 'sinkscope.probes', 'sinkscope.capture.attention') "
            "if m in sys.modules]\n"
            "print('HEAVY=' + ','.join(heavy), file=sys.stderr)\n"
            "sys.exit(status)\n")
    proc = subprocess.run([sys.executable, "-c", code, *args], capture_output=True, text=True, cwd=cwd,
                          env={**os.environ, "PYTHONPATH": SRC}, timeout=120)
    heavy_line = [line for line in proc.stderr.splitlines() if line.startswith("HEAVY=")][-1]
    heavy = {m for m in heavy_line[len("HEAVY="):].split(",") if m}
    return proc.returncode, heavy, proc.stderr


@pytest.mark.parametrize("args", [["--help"], ["sinks", "--help"], ["ls", "hooks"], ["ls", "families"],
                                  ["ls", "commands"], ["sinks", "--seed", "-1"], ["sinks", "--n-seqs", "0"],
                                  ["sinks", "--bos", "maybe"], ["sinks", "--sink-layer-start", "-2"],
                                  ["selectivity", "--help"], ["selectivity", "a", "--min-count", "0"],
                                  ["selectivity", "a", "--group-by", "variant"],
                                  ["heads", "--help"], ["heads", "--sink-set", "sink"],
                                  ["heads", "--dormant-below", "2"],
                                  ["inject", "--help"], ["inject", "--junk", "salt"], ["inject", "--doses", "x"],
                                  ["inject", "--eval-batch", "0"],
                                  ["circuit", "--help"], ["circuit", "--subtract-head", "1.0"],
                                  ["circuit", "--repeats", "2"]])
@pytest.mark.slow  # spawns Python
def test_help_listings_and_option_mistakes_import_no_torch(args):
    status, heavy, stderr = _imports(args)
    assert not heavy, f"{args} imported {heavy}"
    if "--help" not in args and args[0] != "ls":
        assert status == 1 and stderr.count("error:") == 1
    else:
        assert status == 0, stderr


@pytest.mark.slow  # spawns Python
def test_report_reads_a_run_without_torch(tmp_path):
    import shutil

    run = shutil.copytree(TINY_LLAMA_RUN, tmp_path / "run")
    status, heavy, stderr = _imports(["report", str(run)])
    assert status == 0, stderr
    assert not heavy, f"report imported {heavy}"
    assert (run / "report.html").is_file() and (run / "figures" / "heatmap_p0_mass.png").is_file()


@pytest.mark.slow  # spawns Python
def test_report_reads_a_selectivity_comparison_without_torch(tmp_path, text_file, tokenizer):
    """Per-token tables, share bars and the comparison come from the tables alone."""
    from checkpoints import trainer_checkpoint as _checkpoint
    from typer.testing import CliRunner

    from sinkscope.cli import app

    runs = []
    for variant in ("normgate", "sink+proj", "outgate"):
        ckpt = _checkpoint(tmp_path / variant, variant, tokenizer)
        runs.append(tmp_path / f"run-{variant}")
        result = CliRunner().invoke(app, ["selectivity", str(ckpt), "--text-file", str(text_file), "--seq-len", "24",
                                          "--n-seqs", "3", "--min-count", "2", "--out", str(runs[-1]),
                                          "--no-progress", "--no-figures"])
        assert result.exit_code == 0, result.output
    status, heavy, stderr = _imports(["report", *map(str, runs[:2]), "--out", str(tmp_path / "cmp")])
    assert status == 0 and not heavy, (heavy, stderr)
    html = (tmp_path / "cmp" / "report.html").read_text()
    assert 'class="tokens"' in html and (tmp_path / "cmp" / "figures" / "bars_token_share.png").is_file()
    status, heavy, stderr = _imports(["report", str(runs[2])])
    assert status == 0 and not heavy, (heavy, stderr)
    assert "within-row selectivity" in (runs[2] / "report.html").read_text()
