"""One name, one meaning, one default (issue 61, item 10): every measuring command's --help lists its own
options first and the shared ones in sections (Data, Model and device, Output, Executor); ``stream`` takes
``--seq-len`` as the others do (``--length`` still parses), ``measure`` takes ``--set`` for ``--param``, the
help shows each command's ``--n-seqs`` default and ``--dtype``'s short names, and ``--batch-size`` says
which quantity it is."""

from __future__ import annotations

import re

import pytest
from typer.testing import CliRunner

from sinkscope.cli import app, measuring_commands
from sinkscope.cli.options import PANELS, ROUTES, options_of

runner = CliRunner()
MEASURING = sorted(ROUTES)
#: each measuring command's --n-seqs default, sized to its cost (docs/commands/sinks.md's table)
N_SEQS = {"sinks": 16, "selectivity": 256, "heads": 16, "inject": 16, "circuit": 16, "stream": "(1, or 4 with --kv-bits)", "measure": 16,
          "explore": 1}


def _help(*args: str) -> str:
    result = runner.invoke(app, [*args, "--help"], env={"COLUMNS": "80"})
    assert result.exit_code == 0, result.output
    return result.output


def _sections(text: str) -> dict[str, str]:
    """{section title: its lines}, for the sections after the docstring (a line ``Title:`` at column 0)."""
    parts = re.split(r"^([A-Z][A-Za-z ]+):\n", text, flags=re.M)
    return dict(zip(parts[1::2], parts[2::2]))


def _options(section: str) -> list[str]:
    return re.findall(r"^  (?:-\w, )?(--[\w-]+)", section, flags=re.M)


def _entry(text: str, option: str) -> str:
    """The help of ``option`` (its lines, wrapped at 80 columns, joined)."""
    match = re.search(rf"^  (?:-\w, )?{option}[ ,].*?(?=^  -|^\S|^$)", text, flags=re.M | re.S)
    assert match, option
    return " ".join(match.group(0).split())


def test_the_measuring_commands_are_the_routed_ones():
    assert set(MEASURING) == set(N_SEQS)


@pytest.mark.parametrize("command", MEASURING)
def test_help_lists_own_options_first_then_the_shared_sections_in_order(command):
    sections = _sections(_help(command))
    titles = [title for title in sections if title not in ("Arguments", "Examples")]
    assert titles[0] == "Options", titles
    shared = [title for title in titles if title in PANELS]
    assert shared == list(PANELS), titles
    assert titles[-len(PANELS):] == list(PANELS), "a command's own sections come before the shared ones"
    own = _options(sections["Options"])
    assert "--help" in own and not {"--text-file", "--device", "--out", "--executor"} & set(own)
    assert {"--text-file", "--seq-len", "--n-seqs", "--seed", "--bos"} <= set(_options(sections["Data"]))
    assert {"--device", "--dtype", "--device-map", "--attention", "--trust-remote-code"} <= set(_options(sections["Model and device"]))
    assert {"--out", "--overwrite", "--resume", "--figures", "--progress", "--json", "--checkpoint-seconds",
            "--explore-heads"} <= set(_options(sections["Output"]))
    assert {"--executor", "--jobs", "--slurm-partition"} <= set(_options(sections["Executor"]))


@pytest.mark.parametrize("command", MEASURING)
def test_help_shows_the_commands_n_seqs_default(command):
    entry = _entry(_help(command), "--n-seqs")
    assert f"[default: {N_SEQS[command]}]" in entry, entry


def test_the_sections_keep_the_help_examples_whole():
    text = _help("stream")
    assert "sinkscope stream --cache 128,256,512 --sink-tokens 0,1,4 --policy window,sinks,h2o --length 8192" in text
    assert text.index("Examples:") < text.index("Options:") < text.index("Data:") < text.index("Executor:")


def test_dtype_help_lists_the_short_names():
    from sinkscope.models.devices import DTYPE_ALIASES

    entry = _entry(_help("sinks"), "--dtype")
    for alias in ("fp16", "bf16", "fp32", *DTYPE_ALIASES):
        assert alias in entry, alias


def test_batch_size_says_which_quantity_it_is():
    assert _entry(_help("sinks"), "--batch-size").find("Windows per forward pass") > 0
    for command in ("train", "sweep"):
        assert "Sequences per optimizer step" in _entry(_help(command), "--batch-size"), command
    assert "Sequences per Adam step" in _entry(_help("toy"), "--batch-size")


def test_the_lab_commands_group_their_options_too():
    assert list(_sections(_help("sweep")))[-1] == "Executor"
    assert "--out" in _options(_sections(_help("train"))["Output"])


def _captured(monkeypatch, args: list[str]) -> dict:
    """The option fields a measuring command line gives (``_run`` replaced: nothing loads or runs)."""
    seen = {}
    monkeypatch.setattr(measuring_commands, "_run", lambda name, values: seen.update(name=name, values=values))
    result = runner.invoke(app, args)
    assert result.exit_code == 0, result.output
    return options_of(seen["name"], dict(seen["values"]))[0]


def test_stream_takes_seq_len_and_still_length(monkeypatch):
    by_seq_len = _captured(monkeypatch, ["stream", "--seq-len", "256"])
    by_length = _captured(monkeypatch, ["stream", "--length", "256"])
    assert by_seq_len == by_length and by_seq_len["length"] == 256
    assert _captured(monkeypatch, ["stream"])["length"] == 2048


def test_measure_takes_set_for_param(monkeypatch):
    by_param = _captured(monkeypatch, ["measure", "--probe", "p0_mass", "--param", "p0_mass.x=1"])
    by_set = _captured(monkeypatch, ["measure", "--probe", "p0_mass", "--set", "p0_mass.x=1"])
    assert by_param == by_set and list(by_set["params"]) == ["p0_mass.x=1"]
    both = _captured(monkeypatch, ["measure", "-p", "sink_rate", "--param", "sink_rate.epsilon=0.5", "--set", "sink_rate.first_query=1"])
    assert list(both["params"]) == ["sink_rate.epsilon=0.5", "sink_rate.first_query=1"]


def test_measure_set_reaches_the_probe_check():
    result = runner.invoke(app, ["measure", "--probe", "p0_mass", "--set", "n_seqs=4"])
    assert result.exit_code == 1 and "--param takes PROBE.NAME=VALUE" in result.output, result.output
