"""Sections of the overview page. Apps register theirs in their plugins.py, so the console shows
fleet, incidents or goodput at a glance without importing those apps."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from django.http import HttpRequest
from django.template.loader import render_to_string
from django.utils.safestring import SafeString, mark_safe


@dataclass(frozen=True)
class Section:
    name: str
    template: str
    context: Callable[[HttpRequest], dict[str, Any]]
    order: int = 100
    permission: str | None = None  # a section only some roles may see (compliance); None: every role


_sections: dict[str, Section] = {}


def register_section(section: Section) -> None:
    _sections[section.name] = section


def render_sections(request: HttpRequest) -> list[SafeString]:
    rendered = []
    for section in sorted(_sections.values(), key=lambda s: s.order):
        if section.permission and not request.user.has_perm(section.permission):
            continue
        html = render_to_string(section.template, section.context(request), request=request)
        rendered.append(mark_safe(html))  # rendered by our own templates, autoescaped
    return rendered
