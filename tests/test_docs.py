"""The README as a landing page and the documentation site under docs/ (issue 26).

The site build (``mkdocs build --strict``) is skipped when mkdocs is not importable; ``make test``
installs the ``docs`` extra first, so CI runs it.
"""
import importlib.util
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).parent.parent
README = ROOT / "README.md"
DOCS = ROOT / "docs"

# Every section of the README before issue 26, and the page that holds its text now.
OLD_README_SECTIONS = {
    "(opening: what sinkscope measures, the command table)": "index.md",
    "Set-up and run (fresh machine)": "getting-started.md",
    "Use": "getting-started.md",
    "What a run writes": "commands/sinks.md",
    "What a run writes: its `sinkscope report` paragraph": "commands/report.md",
    "Corpus and windows": "getting-started.md",
    "The bundled trainer": "commands/train.md",
    "Gates: `sinkscope selectivity`": "commands/selectivity.md",
    "Implicit gates and head collapse: `sinkscope heads`": "commands/heads.md",
    "Value-read injection and exposure: `sinkscope inject`": "commands/inject.md",
    "The position-zero circuit: `sinkscope circuit`": "commands/circuit.md",
    "Context lengths and sliding windows: `--seq-len A,B,C`, layer types, eviction": "lengths.md",
    "Paired sweeps and the toy task: `sinkscope sweep`, `sinkscope toy`": "commands/sweep-toy.md",
    "Hook points and writing a probe": "writing-a-probe.md",
    "Where things live": "layout.md",
}


def _nav_pages() -> set[str]:
    return set(re.findall(r":\s*(\S+\.md)\s*$", (ROOT / "mkdocs.yml").read_text(encoding="utf-8"), re.M))


def test_the_readme_is_a_landing_page():
    size = README.stat().st_size
    assert size <= 12_500, f"README.md is {size} bytes; move text into docs/ (issue 26)"


def test_the_readme_keeps_the_set_up_commands():
    text = README.read_text(encoding="utf-8")
    assert "    make demo    # set-up, then `sinkscope sinks`" in text
    assert "    make test    # set-up, then the test suite (pytest)" in text
    assert "    make docs    #" in text


def test_every_readme_link_into_docs_resolves():
    text = README.read_text(encoding="utf-8")
    links = re.findall(r"\]\((docs/[^)#\s]+)(?:#[^)]*)?\)", text)
    assert links, "the README links no page of the docs"
    missing = sorted({link for link in links if not (ROOT / link).is_file()})
    assert not missing, f"README.md links to missing files: {missing}"


def test_every_old_readme_section_has_a_page_in_the_nav():
    nav = _nav_pages()
    for section, page in OLD_README_SECTIONS.items():
        assert (DOCS / page).is_file(), f"{section!r}: docs/{page} is missing"
        assert page in nav, f"{section!r}: docs/{page} is not in mkdocs.yml's nav"
    for page in ("SPEC.md", "architectures.md", "results/seeds-on-smollm2.md", "troubleshooting.md", "api.md"):
        assert page in nav


@pytest.mark.parametrize("marker, page", [("api-example", "getting-started.md"), ("probe-example", "writing-a-probe.md")])
def test_the_readme_examples_are_the_docs_examples(marker, page):
    """The README's tested examples (tests/test_api.py, tests/test_platform.py) and the docs' copies agree."""
    pattern = rf"<!-- {marker} -->\s*```python\n(.*?)```"
    readme = re.search(pattern, README.read_text(encoding="utf-8"), re.S)
    docs = re.search(pattern, (DOCS / page).read_text(encoding="utf-8"), re.S)
    assert readme and docs
    assert readme.group(1) == docs.group(1)


@pytest.mark.slow
@pytest.mark.skipif(importlib.util.find_spec("mkdocs") is None, reason="mkdocs is not installed (pip install -e '.[docs]')")
def test_the_site_builds_strict(tmp_path):
    site = tmp_path / "site"
    done = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "-d", str(site)], cwd=ROOT,
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout + done.stderr
    for page in ("index.html", "getting-started.html", "SPEC.html", "architectures.html", "api.html",
                 "commands/sinks.html", "results/seeds-on-smollm2.html"):
        assert (site / page).is_file(), page
    assert "sinkscope.api.measure" in (site / "api.html").read_text(encoding="utf-8")
    # offline: no web fonts, no script or stylesheet from another host
    for html in site.rglob("*.html"):
        text = html.read_text(encoding="utf-8")
        assert "fonts.googleapis" not in text, html
        assert not re.search(r"<(?:script|link)[^>]+(?:src|href)=\"https?://", text), html
