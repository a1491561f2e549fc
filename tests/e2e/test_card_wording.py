"""The reproduction cards' and the explorer's fine print say what the code computes (issue 62, items 4 and 5).

- docs/reproductions.md's Gu et al. card: ``sink_rate``'s default averages alpha_0 over every query t >= 0
  (SPEC.md "Sink rate"), and recipes/gu-inputs.toml sets no ``sink_first_query``, so the card says t ≥ 0.
- docs/explorer.md and ``--explore-heads``'s help: ``auto`` draws its sample first, then takes the top heads
  of the rest (``store.explorer_format.choose_heads``).
"""
import tomllib

from repo_paths import REPO

from sinkscope.cli.options import ExploreHeadsOpt
from sinkscope.store.explorer_format import AUTO_SAMPLE, AUTO_TOP


def _gu_card() -> str:
    text = (REPO / "docs" / "reproductions.md").read_text(encoding="utf-8")
    start = text.index("## Gu et al.")
    return text[start:text.index("\n## ", start + 1)]


def test_the_gu_card_averages_every_query_as_the_recipe_runs():
    card = _gu_card()
    assert "t ≥ 0" in card and "t ≥ 1" not in card
    steps = tomllib.loads((REPO / "recipes" / "gu-inputs.toml").read_text(encoding="utf-8"))["steps"]
    assert all("sink_first_query" not in step.get("options", {}) for step in steps)


def test_the_docs_describe_auto_as_the_code_chooses():
    help_text = ExploreHeadsOpt.__metadata__[0].help
    page = (REPO / "docs" / "explorer.md").read_text(encoding="utf-8")
    for text in (help_text, page):
        assert f"{AUTO_SAMPLE} drawn" in text and f"{AUTO_TOP} other" in text
        assert "plus 4 drawn" not in text


def test_the_explorer_page_states_the_rounding_against_the_computed_weights():
    page = (REPO / "docs" / "explorer.md").read_text(encoding="utf-8")
    assert "7.6e-6" in page and "1.05e-5" in page
