"""errors.py: one sentence, phrased for whoever shows it (the command line's flags, the API's keywords)."""

from __future__ import annotations

import pytest

from sinkscope.errors import Interrupted, SinkscopeError, option, phrase, suggest


@pytest.mark.parametrize("message, cli, api", [
    (f"{option('seq_len')} must be at least 2 (got 1).", "--seq-len must be at least 2 (got 1).",
     "seq_len must be at least 2 (got 1)."),
    (f"use {option('overwrite', True)}, or {option('figures', False)}.", "use --overwrite, or --no-figures.",
     "use overwrite=True, or figures=False."),
    (f"name at least one {option('probes')} with {option('params')} and {option('plugins')}.",
     "name at least one --probe with --param and --plugin.", "name at least one probes with params and plugins."),
    (f"{option('sink_set')} first and {option('cutoffs')} median.", "--sink-set first and --cutoff median.",
     "sink_set first and cutoffs median."),
    ("try --debug, a flag that is no option.", "try --debug, a flag that is no option.",
     "try --debug, a flag that is no option."),
])
def test_an_option_is_phrased_by_who_shows_the_sentence(message, cli, api):
    error = SinkscopeError(message)
    assert str(error) == phrase(message) == cli
    assert error.phrased("api") == phrase(message, "api") == api
    assert "\x02" not in str(error) and error.raw == message


def test_a_sentence_quoting_another_keeps_the_names_unphrased():
    inner = SinkscopeError(f"{option('resume', True)} needs {option('out')}.")
    outer = SinkscopeError(f"{inner.raw.rstrip('.')}; the runs before it are kept.")
    assert str(outer) == "--resume needs --out; the runs before it are kept."
    assert outer.phrased("api") == "resume=True needs out; the runs before it are kept."


def test_interrupted_exits_130_and_suggest_finds_a_close_name():
    assert Interrupted("x").exit_code == 130 and SinkscopeError("x").exit_code == 1
    assert suggest("sinsk", ["sinks", "heads"]) == "; did you mean 'sinks'?" and suggest("zzz", ["sinks"]) == ""
