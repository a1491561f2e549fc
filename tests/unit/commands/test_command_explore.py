"""``commands/explore.py``: its probes and the checks made before anything loads."""

from __future__ import annotations

import pytest

from sinkscope.commands.explore import EXPLORE, EXPLORE_PROBES, ExploreOptions
from sinkscope.errors import SinkscopeError


def test_probes_and_one_window():
    assert [name for name, _ in EXPLORE.probes(ExploreOptions(text="x"), None)] == list(EXPLORE_PROBES)
    assert EXPLORE.one_window and ExploreOptions().explore_windows == 1


@pytest.mark.parametrize("options, words", [
    ({}, "give the text to explore"),
    ({"text": "a", "text_file": "f.txt"}, "not both"),
    ({"text": "a", "dataset": "wikitext"}, "not a dataset"),
    ({"text": "a", "explore_windows": 0}, "must be 1"),
])
def test_mistakes_are_one_sentence(options, words):
    with pytest.raises(SinkscopeError, match=words):
        EXPLORE.check(ExploreOptions(**options))
    EXPLORE.check(ExploreOptions(text="a"))
