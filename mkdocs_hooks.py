"""MkDocs hooks (mkdocs.yml ``hooks:``): the tutorial notebook's links to other pages.

mkdocs-jupyter renders a notebook's markdown cells with nbconvert, so a link written as
``[SPEC.md](SPEC.md)`` stays ``SPEC.md`` in the site, where it is a 404 (in Jupyter it opens the
file, which is why the notebook keeps it). Here each such link becomes the URL of the page it
names, relative to the notebook's page; a link to a file that is no page of the site fails the
build.
"""
from __future__ import annotations

import posixpath
import re

from mkdocs.exceptions import PluginError

_MD_LINK = re.compile(r'href="(?![a-zA-Z][a-zA-Z+.-]*:|#|/)([^"#?]+\.md)(#[^"]*)?"')


def on_page_content(html, page, config, files):
    if not page.file.src_uri.endswith(".ipynb"):
        return html

    def to_url(match: re.Match) -> str:
        target = posixpath.normpath(posixpath.join(posixpath.dirname(page.file.src_uri), match.group(1)))
        linked = files.get_file_from_path(target)
        if linked is None or not linked.is_documentation_page():
            raise PluginError(f"{page.file.src_uri} links to {match.group(1)!r}, which is no page of the site")
        return f'href="{linked.url_relative_to(page.file)}{match.group(2) or ""}"'

    return _MD_LINK.sub(to_url, html)
