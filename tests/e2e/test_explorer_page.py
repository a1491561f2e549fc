"""The explorer in a headless Chromium: what the page holds is what Hugging Face's eager attention computes.

Checked on a tiny Llama (a MODEL folder) and a tiny gpt-oss (learned sinks, sliding window), each
measured by ``sinks`` into a run folder with its report:
- ``sinkscopeExplorer.weight(layer, head, query, key, window)`` equals HF eager attention on the
  run's tokens.npy within 2e-3 (the stored precision is 1e-3), for every stored head, window and
  cell; ``phantom`` equals 1 - the row's sum on gpt-oss;
- clicking a head in the grid and hovering a cell shows a tooltip whose weight equals eager
  attention within the stored precision;
- the page logs no JavaScript error or warning, and loads nothing from the network;
- the heads grid and the pattern share one colour scale, dark = high (their legends and the grid's cells).
"""

from __future__ import annotations

import re

import numpy as np
import pytest
import torch

import sinkscope
from sinkscope.run.result import Result
from tiny_models import build, random_ids

pytestmark = pytest.mark.slow  # drives the browser

ARGS = ["--no-sandbox", "--disable-gpu", "--disable-background-networking", "--disable-component-update",
        "--disable-sync", "--no-first-run"]


def eager(model, ids: np.ndarray) -> list[np.ndarray]:
    previous = model.config._attn_implementation
    model.config._attn_implementation = "eager"
    try:
        with torch.no_grad():
            out = model(torch.as_tensor(ids), output_attentions=True)
    finally:
        model.config._attn_implementation = previous
    return [a.double().numpy() for a in out.attentions]


@pytest.fixture(scope="module")
def runs(tmp_path_factory, tiny_llama_dir):
    from transformers import AutoModelForCausalLM

    folder = tmp_path_factory.mktemp("explorer-runs")
    quiet = {"progress": False, "log": lambda message: None}
    llama_out = folder / "llama"
    sinkscope.measure("sinks", str(tiny_llama_dir), windows=random_ids(3, 40, seed=1), out=str(llama_out), **quiet)
    gpt_oss = build("gpt_oss")
    oss_out = folder / "gpt-oss"
    sinkscope.measure("sinks", gpt_oss, windows=random_ids(2, 24, seed=2), out=str(oss_out), explore_heads="all",
                      **quiet)
    return {"llama": (llama_out, AutoModelForCausalLM.from_pretrained(tiny_llama_dir).eval()),
            "gpt-oss": (oss_out, gpt_oss)}


def open_page(pw, chromium, path, console, failures, requests):
    browser = pw.chromium.launch(executable_path=chromium, headless=True, args=ARGS)
    page = browser.new_page(viewport={"width": 1280, "height": 1000})
    page.on("console", lambda m: console.append((m.type, m.text)))
    page.on("pageerror", lambda e: failures.append(str(e)))
    page.on("request", lambda r: requests.append(r.url))
    page.goto(path.as_uri(), wait_until="load")
    ready = page.evaluate("sinkscopeExplorer.ready")
    assert ready["failed"] == 0 and ready["decoded"] == ready["blocks"] > 0
    return browser, page


@pytest.mark.parametrize("name", ["llama", "gpt-oss"])
def test_the_pages_weights_are_eager_attention(runs, name, chromium):
    chromium, sync_api = chromium
    out, model = runs[name]
    run = Result.load(out)
    reference = eager(model, run.tokens)
    T = run.tokens.shape[1]
    console, failures, requests = [], [], []
    with sync_api.sync_playwright() as pw:
        browser, page = open_page(pw, chromium, out / "report.html", console, failures, requests)
        for window in run.explorer.windows.tolist():
            for layer, head in run.explorer.heads.tolist():
                got = np.array(page.evaluate(
                    """([l, h, w, T]) => Array.from({length: T}, (_, q) => Array.from({length: T},
                        (_, k) => sinkscopeExplorer.weight(l, h, q, k, w)))""", [layer, head, window, T]), dtype=float)
                a = reference[layer][window, head]
                assert np.abs(got - a).max() < 2e-3, (window, layer, head)
                if name == "gpt-oss":
                    phantom = np.array(page.evaluate(
                        "([l, h, w, T]) => Array.from({length: T}, (_, q) => sinkscopeExplorer.phantom(l, h, q, w))",
                        [layer, head, window, T]))
                    np.testing.assert_allclose(phantom, 1 - a.sum(-1), atol=1e-5)
        stored = {tuple(x) for x in run.explorer.heads.tolist()}
        missing = next(((l, h) for l in range(3) for h in range(4) if (l, h) not in stored), None)
        if missing is not None:
            assert page.evaluate("([l, h]) => sinkscopeExplorer.weight(l, h, 3, 0)", list(missing)) is None
        browser.close()
    assert not [c for c in console if c[0] in ("error", "warning")], console
    assert not failures
    assert all(u.startswith(("file://", "data:", "blob:")) for u in requests), requests


def test_clicking_a_head_and_hovering_a_cell_shows_the_eager_weight(runs, chromium):
    chromium, sync_api = chromium
    out, model = runs["llama"]
    run = Result.load(out)
    reference = eager(model, run.tokens)
    layer, head = run.explorer.heads.tolist()[3]  # not the head the page opens with
    console, failures, requests = [], [], []
    with sync_api.sync_playwright() as pw:
        browser, page = open_page(pw, chromium, out / "report.html", console, failures, requests)
        where = page.evaluate("([l, h]) => sinkscopeExplorer.headCenter(l, h)", [layer, head])
        page.mouse.click(where["x"], where["y"])
        page.wait_for_function("([l, h]) => { const s = sinkscopeExplorer.state(); return s.layer === l && s.head === h "
                               "&& s.shown; }", arg=[layer, head])
        page.evaluate("sinkscopeExplorer.resetZoom()")
        for query, key in ((20, 0), (20, 19), (37, 5)):
            cell = page.evaluate("([q, k]) => sinkscopeExplorer.cellCenter(q, k)", [query, key])
            page.mouse.move(cell["x"], cell["y"])
            tip = page.locator(".sx-tooltip")
            tip.wait_for(state="visible")
            attrs = page.evaluate("""() => { const t = document.querySelector('.sx-tooltip');
                return {layer: t.dataset.layer, head: t.dataset.head, query: t.dataset.query, key: t.dataset.key,
                        window: t.dataset.window, weight: t.dataset.weight, text: t.textContent}; }""")
            assert (int(attrs["layer"]), int(attrs["head"]), int(attrs["query"]), int(attrs["key"])) == \
                (layer, head, query, key)
            expected = reference[layer][int(attrs["window"]), head, query, key]
            assert abs(float(attrs["weight"]) - expected) <= 1e-3, (attrs, expected)
        page.screenshot(path=str(out / "explorer-test.png"))
        browser.close()
    assert not [c for c in console if c[0] in ("error", "warning")], console
    assert not failures


def _rgb(text: str) -> list[tuple[int, int, int]]:
    return [tuple(int(v) for v in m) for m in re.findall(r"rgb\((\d+),\s*(\d+),\s*(\d+)\)", text)]


def _lightness(rgb) -> float:
    r, g, b = rgb[:3]
    return 0.2126 * r + 0.7152 * g + 0.0722 * b


def test_the_grid_and_the_pattern_share_one_colour_scale_dark_high(runs, chromium):
    """issue 61 item 9: the heads grid and the pattern draw high values dark, on the same colour map.

    The two legends' gradients are the same colours in the same order, light at the low end; on the
    grid, the cell of the head with the largest p0 mass (the run's table) is darker than the smallest's.
    """
    chromium, sync_api = chromium
    out, _ = runs["llama"]
    table = Result.load(out).table
    heads = table[(table.metric == "p0_mass") & table.layer.notna() & table["head"].notna()]
    top, bottom = heads.loc[heads.value.idxmax()], heads.loc[heads.value.idxmin()]
    console, failures, requests = [], [], []
    with sync_api.sync_playwright() as pw:
        browser, page = open_page(pw, chromium, out / "report.html", console, failures, requests)
        grid_bar, pattern_bar = page.evaluate("""() => ['.sx-metric-legend', '.sx-pattern-legend'].map(
            s => document.querySelector(s + ' .sx-legend-bar').style.background)""")
        grid, pattern = _rgb(grid_bar), _rgb(pattern_bar)
        assert len(grid) == 11 and grid == pattern
        assert _lightness(grid[0]) > _lightness(grid[-1])  # light = low, dark = high
        sample = """([l, h]) => {
            const e = sinkscopeExplorer, c = document.querySelector('.sx-grid');
            const p = e.headCenter(l, h), q = e.headCenter(l, h > 0 ? h - 1 : h + 1);
            const r = c.getBoundingClientRect(), x = p.x + 0.35 * Math.abs(q.x - p.x);  // beside a stored head's dot
            const px = c.getContext('2d').getImageData(Math.round((x - r.left) * c.width / r.width),
                                                       Math.round((p.y - r.top) * c.height / r.height), 1, 1).data;
            return [px[0], px[1], px[2]]; }"""
        high = page.evaluate(sample, [int(top.layer), int(top["head"])])
        low = page.evaluate(sample, [int(bottom.layer), int(bottom["head"])])
        browser.close()
    assert _lightness(high) < _lightness(low), (high, low)
    assert not failures
