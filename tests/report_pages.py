"""Reading a report.html back in tests: every <table> as rows of cell texts, the sections, the URLs."""

from __future__ import annotations

from html.parser import HTMLParser
from pathlib import Path


class Tables(HTMLParser):
    """Collects every <table> as rows of cell texts, with the table's attributes."""

    def __init__(self):
        super().__init__()
        self.tables: list[tuple[dict, list[list[str]]]] = []
        self.sections: list[str] = []
        self.urls: list[str] = []
        self._cell = None

    def handle_starttag(self, tag, attrs):
        attrs = dict(attrs)
        if tag == "table":
            self.tables.append((attrs, []))
        elif tag == "tr" and self.tables:
            self.tables[-1][1].append([])
        elif tag in ("td", "th"):
            self._cell = ""
        elif tag == "section" and "data-probe" in attrs:
            self.sections.append(attrs["data-probe"])
        for key in ("src", "href"):
            if key in attrs:
                self.urls.append(attrs[key])

    def handle_data(self, data):
        if self._cell is not None:
            self._cell += data

    def handle_endtag(self, tag):
        if tag in ("td", "th") and self._cell is not None:
            self.tables[-1][1][-1].append(self._cell.strip())
            self._cell = None


def parse(page: Path) -> Tables:
    parser = Tables()
    parser.feed(page.read_text())
    return parser
