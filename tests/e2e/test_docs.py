"""The README as a landing page and the documentation site under docs/ (issue 26).

The site build (``mkdocs build --strict``) is skipped when mkdocs is not importable; ``make test``
installs the ``docs`` extra first, so CI runs it.
"""
import importlib.util
import re
import subprocess
import sys
from pathlib import Path
from urllib.parse import urlsplit
from urllib.request import url2pathname

import pytest
from repo_paths import REPO

ROOT = REPO
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
    assert "    make test    # set-up, then the fast tests" in text
    assert "    make test-all\n" in text  # what CI runs (.ci/run)
    assert "make test-all" in (REPO / ".ci" / "run").read_text(encoding="utf-8")
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
    for page in ("SPEC.md", "architectures.md", "results/papers-on-smollm2.md", "troubleshooting.md", "api.md"):
        assert page in nav


@pytest.mark.parametrize("marker, page", [("api-example", "getting-started.md"), ("probe-example", "writing-a-probe.md")])
def test_the_readme_examples_are_the_docs_examples(marker, page):
    """The README's tested examples (tests/integration/test_api.py, tests/integration/test_platform.py) and the docs' copies agree."""
    pattern = rf"<!-- {marker} -->\s*```python\n(.*?)```"
    readme = re.search(pattern, README.read_text(encoding="utf-8"), re.S)
    docs = re.search(pattern, (DOCS / page).read_text(encoding="utf-8"), re.S)
    assert readme and docs
    assert readme.group(1) == docs.group(1)


@pytest.fixture(scope="module")
def built_site(tmp_path_factory) -> Path:
    """One strict build of the site for the tests below (skipped without mkdocs)."""
    if importlib.util.find_spec("mkdocs") is None:
        pytest.skip("mkdocs is not installed (pip install -e '.[docs]')")
    site = tmp_path_factory.mktemp("docs") / "site"
    done = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "-d", str(site)], cwd=ROOT,
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout + done.stderr
    return site


@pytest.mark.slow  # builds the docs
def test_the_site_builds_strict(built_site):
    site = built_site
    for page in ("index.html", "getting-started.html", "SPEC.html", "architectures.html", "api.html",
                 "commands/sinks.html", "results/papers-on-smollm2.html", "tutorial.html"):
        assert (site / page).is_file(), page
    assert "sinkscope.api.measure" in (site / "api.html").read_text(encoding="utf-8")
    # offline: no web fonts, no script or stylesheet from another host
    for html in site.rglob("*.html"):
        text = html.read_text(encoding="utf-8")
        assert "fonts.googleapis" not in text, html
        assert not re.search(r"<(?:script|link)[^>]+(?:src|href)=\"https?://", text), html
    # search from file:// (Material's offline plugin): the index inlined as a script, and the local
    # worker polyfill in place of the one the plugin would fetch from unpkg.com
    assert (site / "search" / "search_index.json").is_file()
    assert (site / "search" / "search_index.js").read_text(encoding="utf-8").startswith("var __index = {")
    assert (site / "javascripts" / "iframe-worker.js").is_file()
    assert "unpkg.com" not in (site / "index.html").read_text(encoding="utf-8")


@pytest.mark.slow  # builds the docs
def test_the_tutorial_renders_with_its_outputs(built_site):
    """docs/tutorial.ipynb is a page of the site with the outputs it was committed with, and its
    links to other pages (``SPEC.md`` in the notebook) point at the built pages."""
    html = (built_site / "tutorial.html").read_text(encoding="utf-8")
    assert "Tutorial: attention sinks in SmolLM2" in html
    assert html.count('src="data:image/png;base64,') >= 4  # the figures
    assert "sinkscope.measure(" in html and "register_probe" in html
    assert 'href="SPEC.html"' in html and 'href="commands/sinks.html"' in html
    assert not re.search(r'href="(?!https?:)[^"#]+\.md[#"]', html), "a link to a .md file was left as it is"


def test_the_hook_turns_the_notebooks_md_links_into_page_urls():
    """mkdocs_hooks.py: in a notebook page, ``page.md`` links become the built pages' URLs; a link to a
    file that is no page fails the build; other pages and external links are left as they are."""
    pytest.importorskip("mkdocs")
    from types import SimpleNamespace

    from mkdocs.exceptions import PluginError
    from mkdocs.structure.files import File, Files

    spec = importlib.util.spec_from_file_location("mkdocs_hooks", ROOT / "mkdocs_hooks.py")
    hooks = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(hooks)
    files = Files([File(path, str(DOCS), "/site", use_directory_urls=False)
                   for path in ("tutorial.ipynb", "SPEC.md", "commands/sinks.md")])
    notebook = SimpleNamespace(file=files.get_file_from_path("tutorial.ipynb"))
    html = ('<a href="SPEC.md">a</a> <a href="commands/sinks.md#options">b</a> '
            '<a href="https://example.org/x.md">c</a> <a href="#SPEC.md">d</a>')
    assert hooks.on_page_content(html, notebook, None, files) == (
        '<a href="SPEC.html">a</a> <a href="commands/sinks.html#options">b</a> '
        '<a href="https://example.org/x.md">c</a> <a href="#SPEC.md">d</a>')
    with pytest.raises(PluginError, match="missing.md"):
        hooks.on_page_content('<a href="missing.md">x</a>', notebook, None, files)
    page = SimpleNamespace(file=files.get_file_from_path("SPEC.md"))
    assert hooks.on_page_content('<a href="missing.md">x</a>', page, None, files) == '<a href="missing.md">x</a>'


#: the pages the browser opens, with a word their <h1> holds
BROWSED = {"index.html": "sinkscope", "commands/sinks.html": "sinks", "api.html": "API",
           "tutorial.html": "Tutorial"}


@pytest.mark.slow  # builds the docs, drives the browser
def test_the_site_opens_offline_in_a_headless_browser(built_site, tmp_path, chromium):
    """From file://, the index, a command page, the API page and the tutorial render with every asset
    found and no console error, nothing is requested from any host, and the search box answers."""
    chromium, sync_api = chromium
    console, requests, failures = [], [], []
    with sync_api.sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=chromium, headless=True, args=[
            "--no-sandbox", "--disable-gpu", "--disable-background-networking", "--disable-component-update",
            "--disable-sync", "--no-first-run"])
        page = browser.new_page(viewport={"width": 1280, "height": 900})
        page.route(re.compile(r"^(?!file:|data:|about:|blob:)"), lambda route: route.abort())  # never the network
        page.on("console", lambda m: console.append((m.type, m.text, page.url)))
        page.on("pageerror", lambda e: failures.append(f"{page.url}: {e}"))
        page.on("request", lambda r: requests.append(r.url))
        page.on("requestfailed", lambda r: failures.append(f"{r.url}: {r.failure}"))
        page.on("response", lambda r: r.status >= 400 and failures.append(f"{r.url}: HTTP {r.status}"))
        seen = {}
        for name, heading in BROWSED.items():
            page.goto((built_site / name).as_uri(), wait_until="load")
            page.wait_for_load_state("networkidle")
            seen[name] = {
                "title": page.title(),
                "h1": page.inner_text("article h1"),
                "styled": page.evaluate("getComputedStyle(document.querySelector('.md-header')).position"),
                "images": page.eval_on_selector_all("article img", "els => els.map(e => e.complete && e.naturalWidth > 0)"),
            }
            assert heading.lower() in seen[name]["h1"].lower(), (name, seen[name])
            assert seen[name]["title"].endswith("sinkscope"), (name, seen[name])
            assert seen[name]["styled"] in ("sticky", "fixed"), (name, seen[name])  # Material's CSS applied
            assert all(seen[name]["images"]), (name, seen[name])
        assert len(seen["tutorial.html"]["images"]) >= 4
        assert not failures, failures  # a missing asset, a script error, a request to another host
        # the search box, from file:// (the index is read from search/search_index.js)
        page.goto((built_site / "index.html").as_uri(), wait_until="load")
        page.locator("input.md-search__input").click()
        page.locator("input.md-search__input").press_sequentially("phantom", delay=20)
        hits = page.locator(".md-search-result__item")
        hits.first.wait_for(state="visible", timeout=20_000)
        found = page.eval_on_selector_all(".md-search-result__link", "els => els.map(e => e.href)")
        page.screenshot(path=str(tmp_path / "search.png"))
        browser.close()
    assert found, "the search box gave no result"
    assert any("SPEC.html" in url for url in found), found
    for url in found:  # every hit links to a built page (search.highlight adds ?h=phantom)
        parts = urlsplit(url)
        assert parts.scheme == "file" and Path(url2pathname(parts.path)).is_file(), url
    foreign = [u for u in requests if not u.startswith(("file://", "data:", "about:", "blob:"))]
    assert not foreign, f"requests to other hosts: {foreign}"
    assert not failures, failures
    assert not [c for c in console if c[0] == "error"], console
    assert any(u.endswith("search/search_index.js") for u in requests), "the offline index was not read"
