"""The explorer's cost in a browser: report size, time to first paint, decode and redraw times.

    python benchmarks/bench_explorer.py RUN [RUN ...] [--screenshot docs/figures/explorer.png]

Each RUN is a run folder written with figures (its report.html holds the explorer). For each run
the script prints:

- the page's size and the explorer's share (``manifest.explorer.page_bytes``), against the 5 MB
  the default budget keeps report.html under;
- in headless Chromium (``/usr/bin/chromium`` or ``$CHROMIUM``; playwright's sync API), the time
  from navigation to the first pattern painted (``sinkscopeExplorer.firstPaintAt``), to every block
  decoded (``ready``), and the median redraw after a wheel zoom and after a pan (``lastDrawMs``).

``--screenshot PATH`` also saves the first run's explorer (``--screenshot-head L.H`` open, zoomed
to the first 80 queries, a token of the text view hovered) as the docs' figure. Not a test; CI does not run it.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import time
from pathlib import Path


def chromium() -> str:
    path = os.environ.get("CHROMIUM") or shutil.which("chromium") or shutil.which("chromium-browser")
    if not path:
        raise SystemExit("no chromium: install Debian's chromium or set CHROMIUM")
    return path


def measure(run: Path, pw, screenshot: Path | None, screenshot_head: str | None = None) -> dict:
    manifest = json.loads((run / "manifest.json").read_text())
    page_path = run / "report.html"
    browser = pw.chromium.launch(executable_path=chromium(), headless=True, args=["--no-sandbox", "--disable-gpu"])
    page = browser.new_page(viewport={"width": 1280, "height": 1000})
    errors = []
    page.on("pageerror", lambda e: errors.append(str(e)))
    page.on("console", lambda m: errors.append(m.text) if m.type in ("error", "warning") else None)
    started = time.perf_counter()
    page.goto(page_path.as_uri(), wait_until="load")
    page.wait_for_function("window.sinkscopeExplorer && sinkscopeExplorer.firstPaintAt !== null")
    first_paint = page.evaluate("sinkscopeExplorer.firstPaintAt")
    page.evaluate("sinkscopeExplorer.ready")
    ready = page.evaluate("performance.now()")
    wall = time.perf_counter() - started
    canvas = page.locator("canvas.sx-pattern").first
    canvas.scroll_into_view_if_needed()
    box = canvas.bounding_box()
    zooms, pans = [], []
    for _ in range(6):
        page.mouse.move(box["x"] + box["width"] * 0.3, box["y"] + box["height"] * 0.6)
        page.mouse.wheel(0, -240)
        page.wait_for_timeout(60)
        zooms.append(page.evaluate("sinkscopeExplorer.lastDrawMs"))
    for _ in range(6):
        page.mouse.move(box["x"] + box["width"] / 2, box["y"] + box["height"] / 2)
        page.mouse.down()
        page.mouse.move(box["x"] + box["width"] / 2 + 40, box["y"] + box["height"] / 2 + 30, steps=3)
        page.mouse.up()
        page.wait_for_timeout(60)
        pans.append(page.evaluate("sinkscopeExplorer.lastDrawMs"))
    if screenshot is not None:
        if screenshot_head:
            layer, head = (int(x) for x in screenshot_head.split("."))
            page.evaluate("([l, h]) => sinkscopeExplorer.open(l, h)", [layer, head])
        page.evaluate("sinkscopeExplorer.setZoom(4, 40, 20)")
        tokens = page.locator(".sx-token")
        tokens.nth(min(60, tokens.count() - 1)).hover()
        page.wait_for_timeout(100)
        page.locator("[data-sinkscope-explorer]").first.screenshot(path=str(screenshot))
    browser.close()
    explorer = manifest.get("explorer") or {}
    return {"run": str(run), "seq_len": manifest["windows"]["seq_len"],
            "report_mb": round(page_path.stat().st_size / 1e6, 2),
            "explorer_mb": round(explorer.get("page_bytes", 0) / 1e6, 2),
            "patterns": f"{explorer.get('patterns_kept')} kept, {explorer.get('patterns_left_out')} left out",
            "first_paint_ms": round(first_paint), "all_decoded_ms": round(ready), "wall_s": round(wall, 2),
            "zoom_redraw_ms": round(statistics.median(zooms), 1), "pan_redraw_ms": round(statistics.median(pans), 1),
            "errors": errors}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("runs", nargs="+", type=Path)
    parser.add_argument("--screenshot", type=Path, default=None)
    parser.add_argument("--screenshot-head", default=None, help="LAYER.HEAD to open for the screenshot")
    args = parser.parse_args()
    from playwright.sync_api import sync_playwright

    with sync_playwright() as pw:
        for i, run in enumerate(args.runs):
            row = measure(run, pw, args.screenshot if i == 0 else None, args.screenshot_head)
            print(" | ".join(f"{k} {v}" for k, v in row.items()))


if __name__ == "__main__":
    main()
