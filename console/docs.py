"""The manual: each file of docs/ rendered at /docs/<page>/, for anyone signed in (as the API docs
are), offline like everything else the console serves.

What must stay true:
- Only the Markdown files directly in docs/ are pages: a name is looked up among them, never joined
  into a path, so an unknown name is a 404 and nothing outside docs/ can be reached.
- Raw HTML in a page is shown as text (markdown-it's `html` option off), so a page can carry no
  script or markup of its own; the Content-Security-Policy would refuse inline script anyway.
- Pages link to each other as a clone reads them (`fleet.md#time-ranges`), and headings get the
  anchors GitHub gives them, so the same links work on GitHub, in an editor and here.
  tests/console/test_docs.py holds every such link to a page and heading that exist.
"""

from __future__ import annotations

import itertools
import re
from functools import lru_cache
from pathlib import Path
from typing import Any

from django.conf import settings
from django.http import Http404, HttpRequest, HttpResponse
from django.shortcuts import render
from django.urls import path, reverse
from django.views import View
from markdown_it import MarkdownIt
from markdown_it.token import Token

from console.permissions import DashboardRequiredMixin

DOCS_DIR = Path(settings.BASE_DIR) / "docs"
INDEX = "index"
_PAGE_LINK = re.compile(r"^(?P<page>[a-z0-9-]+)\.md(?P<anchor>#[\w-]*)?$")


def page_names() -> list[str]:
    """The manual's pages, by file name without `.md`."""
    return sorted(p.stem for p in DOCS_DIR.glob("*.md"))


def reading_order() -> list[str]:
    """The index, then the pages in the order the index links them, then any it does not."""
    linked = [
        match["page"]
        for token in parse(INDEX)
        for child in token.children or []
        if child.type == "link_open" and (match := _PAGE_LINK.match(str(child.attrGet("href"))))
    ]
    names = page_names()
    ordered = [INDEX, *dict.fromkeys(n for n in linked if n in names and n != INDEX)]
    return ordered + [n for n in names if n not in ordered]


def slug(text: str) -> str:
    """A heading's anchor as GitHub makes it: lower case, punctuation dropped, spaces to hyphens."""
    return re.sub(r"[^\w\- ]", "", text.strip().lower()).replace(" ", "-")


def heading_anchors(tokens: list[Token]) -> list[str]:
    """Every heading's anchor in page order; a repeated one gets -1, -2 as on GitHub."""
    anchors: list[str] = []
    seen: dict[str, int] = {}
    for opening, inline in itertools.pairwise(tokens):
        if opening.type == "heading_open":
            base = slug(inline.content)
            count = seen.get(base, 0)
            seen[base] = count + 1
            anchors.append(f"{base}-{count}" if count else base)
    return anchors


def _markdown() -> MarkdownIt:
    return MarkdownIt("commonmark", {"html": False}).enable("table")


def parse(name: str) -> list[Token]:
    """A page's block tokens (headings, paragraphs with their inline children)."""
    return _markdown().parse((DOCS_DIR / f"{name}.md").read_text(encoding="utf-8"))


def page_url(name: str) -> str:
    return reverse("docs:index") if name == INDEX else reverse("docs:page", args=[name])


@lru_cache(maxsize=64)
def _render(name: str, mtime_ns: int) -> tuple[str, str]:
    """(title, HTML) of a page; keyed by the file's mtime so an edited page renders afresh."""
    tokens = parse(name)
    anchors = iter(heading_anchors(tokens))
    title = name
    for token, following in itertools.pairwise(tokens):
        if token.type == "heading_open":
            token.attrSet("id", next(anchors))
            if token.tag == "h1" and title == name:
                title = following.content
        for child in token.children or []:
            href = str(child.attrGet("href") or "") if child.type == "link_open" else ""
            if match := _PAGE_LINK.match(href):
                child.attrSet("href", page_url(match["page"]) + (match["anchor"] or ""))
    md = _markdown()
    return title, md.renderer.render(tokens, md.options, {})


def render_page(name: str) -> tuple[str, str]:
    if name not in page_names():
        raise Http404(f"The manual has no page {name!r}.")
    return _render(name, (DOCS_DIR / f"{name}.md").stat().st_mtime_ns)


class ManualView(DashboardRequiredMixin, View):
    def get(self, request: HttpRequest, page: str = INDEX) -> HttpResponse:
        title, body = render_page(page)
        context: dict[str, Any] = {
            "title": title,
            "body": body,
            "page": page,
            "pages": [{"name": name, "title": render_page(name)[0], "url": page_url(name)} for name in reading_order()],
        }
        return render(request, "console/docs.html", context)


app_name = "docs"
urlpatterns = [
    path("", ManualView.as_view(), name="index"),
    path("<slug:page>/", ManualView.as_view(), name="page"),
]
