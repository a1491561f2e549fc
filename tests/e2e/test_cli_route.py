"""The typed route from the command line (issue 55, item 4): every CLI parameter of a measuring command is
a field of its options dataclass (checked when the CLI module is imported), nothing is dropped on the way,
and every measuring command takes ``MODEL...`` the same way: several models give one run each and one
comparison."""

from __future__ import annotations

import json
from typing import Annotated, Optional

import pytest
import typer
from typer.testing import CliRunner

from sinkscope.cli import app
from sinkscope.cli.options import ROUTES, run_options
from sinkscope.commands import discover
from sinkscope.errors import SinkscopeError
from sinkscope.run.plan import make_options

runner = CliRunner()


def test_a_cli_parameter_that_is_no_option_field_fails_at_import_time():
    with pytest.raises(TypeError, match=r"sinks: the CLI parameters \['sink_epsilom'\] are no field of SinksOptions"):
        @run_options("sinks")
        def sinks(model: Optional[list[str]] = None,
                  sink_epsilom: Annotated[float, typer.Option("--sink-epsilom")] = 0.3, **shared):
            pass


def test_every_measuring_command_declares_its_route():
    assert set(ROUTES) == set(discover())


def test_a_misspelt_option_is_one_sentence_not_a_silent_drop():
    from sinkscope.commands import get_command

    with pytest.raises(SinkscopeError, match="sinks has no option 'n_seq'; did you mean 'n_seqs'"):
        make_options(get_command("sinks"), {"n_seq": 4})


@pytest.mark.parametrize("command,extra", [("sinks", []), ("measure", ["--probe", "p0_mass"])])
def test_several_models_give_one_run_each_and_a_comparison(command, extra, tiny_llama_dir, text_file, tmp_path):
    other = tmp_path / "other"
    import shutil

    shutil.copytree(tiny_llama_dir, other)
    out = tmp_path / "cmp"
    result = runner.invoke(app, [command, str(tiny_llama_dir), str(other), *extra, "--text-file", str(text_file),
                                 "--seq-len", "16", "--n-seqs", "2", "--out", str(out), "--no-figures",
                                 "--no-progress", "--executor", "local"])
    assert result.exit_code == 0, result.output
    record = json.loads((out / "comparison.json").read_text())
    assert len(record["runs"]) == 2
    for name in record["runs"]:
        assert (out / name / "results.csv").is_file()
