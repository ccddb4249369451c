"""The training-content summary pages: a model's live draft with the Publish button, its published
versions (hash, verified flag, downloads) and each version's diff against the one before; and one
published version on its own page. Compliance officers and admins only."""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

from django.contrib import messages
from django.http import HttpRequest, HttpResponse, HttpResponseRedirect
from django.shortcuts import get_object_or_404
from django.urls import reverse
from django.utils import timezone
from django.views.generic import TemplateView

from compliance.models import GpaiModel, SummaryVersion
from compliance.permissions import ComplianceRequiredMixin
from compliance.services import markdown, summary

# "- **Question?** answer": the template's question (no asterisk in any) and the escaped answer.
_LABELLED = re.compile(r"^\*\*(?P<label>[^*]+)\*\*\s*(?P<value>.*)$")


@dataclass
class Block:
    """One line (or table) of the summary's Markdown, for the page to lay out: the page shows the
    very text that is hashed, so what an officer reads is what gets published."""

    kind: str  # h1, h2, h3, h4, item, table
    text: str = ""
    label: str = ""
    level: int = 0
    rows: list[list[str]] = field(default_factory=list)

    @property
    def parts(self) -> list[tuple[str, bool]]:
        """The text cut around each "to be provided", flagged, so the page can mark every one."""
        return _marked(self.text)


def _marked(text: str) -> list[tuple[str, bool]]:
    pieces = text.split(summary.TO_BE_PROVIDED)
    out: list[tuple[str, bool]] = []
    for i, piece in enumerate(pieces):
        if i:
            out.append((summary.TO_BE_PROVIDED, True))
        if piece:
            out.append((piece, False))
    return out


def blocks(text: str) -> list[Block]:
    """The Markdown subset of compliance.services.pdf as blocks (headings, items, tables), with the
    escapes of free text resolved (the template autoescapes what it shows)."""
    out: list[Block] = []
    for line in text.splitlines():
        if not line.strip():
            continue
        if line.startswith("#"):
            level = len(line) - len(line.lstrip("#"))
            out.append(Block(f"h{level}", markdown.unescape(line[level:].strip())))
        elif line.startswith("|"):
            cells = markdown.cells(line)
            if markdown.is_rule(cells):
                continue
            if not out or out[-1].kind != "table":
                out.append(Block("table"))
            out[-1].rows.append([markdown.unescape(c) for c in cells])
        else:
            stripped = line.lstrip()
            level = (len(line) - len(stripped)) // 2
            body = stripped.removeprefix("- ")
            match = _LABELLED.match(body)
            if match:
                out.append(Block("item", markdown.unescape(match["value"]), match["label"], level))
            else:
                out.append(Block("item", markdown.unescape(body), level=level))
    return out


def diff_lines(text: str) -> list[tuple[str, str]]:
    """A unified diff as (css class, line): added, removed, hunk header or context."""
    kinds = []
    for line in text.splitlines():
        if line.startswith(("+++", "---")):
            kinds.append(("diff-file", line))
        elif line.startswith("+"):
            kinds.append(("diff-add", line))
        elif line.startswith("-"):
            kinds.append(("diff-del", line))
        elif line.startswith("@@"):
            kinds.append(("diff-hunk", line))
        else:
            kinds.append(("diff-ctx", line))
    return kinds


def _version_context(version: SummaryVersion, before: SummaryVersion | None) -> dict[str, Any]:
    return {
        "obj": version,
        "verified": version.verify(),
        "diff": diff_lines(summary.diff(before, version)),
        "before": before,
        "downloads": [
            (
                fmt.upper(),
                reverse("api:compliance-api:summary-version-export", args=[version.model_id, version.version, fmt]),
            )
            for fmt in summary.EXPORT_FORMATS
        ],
    }


class SummaryView(ComplianceRequiredMixin, TemplateView):
    """The draft as the register makes it now, the Publish button, and the published versions."""

    template_name = "compliance/summary/summary.html"

    def get_context_data(self, **kwargs: Any) -> dict[str, Any]:
        context = super().get_context_data(**kwargs)
        model = get_object_or_404(GpaiModel, pk=self.kwargs["pk"])
        draft = summary.render_markdown(summary.build_document(model), version=None, last_update=timezone.localdate())
        versions = list(model.summaries.select_related("published_by").order_by("version"))
        context.update(
            model=model,
            draft=blocks(draft),
            tbp=summary.TO_BE_PROVIDED,
            pending=draft.count(summary.TO_BE_PROVIDED),
            versions=[
                _version_context(v, versions[i - 1] if i else None) for i, v in reversed(list(enumerate(versions)))
            ],
        )
        return context

    def post(self, request: HttpRequest, pk: int) -> HttpResponse:
        model = get_object_or_404(GpaiModel, pk=pk)
        try:
            version = summary.publish(model, user=request.user)
        except summary.SummaryUnchanged as exc:
            return self.render_to_response(self.get_context_data(refusal=str(exc)), status=409)
        messages.success(request, f"Published version {version.version}: SHA-256 {version.sha256}.")
        return HttpResponseRedirect(reverse("compliance:summary-version", args=[pk, version.version]))


class SummaryVersionView(ComplianceRequiredMixin, TemplateView):
    """One published version: its text, hash, verification, downloads and its diff."""

    template_name = "compliance/summary/version.html"

    def get_context_data(self, **kwargs: Any) -> dict[str, Any]:
        context = super().get_context_data(**kwargs)
        version = get_object_or_404(
            SummaryVersion.objects.select_related("model", "published_by"),
            model_id=self.kwargs["pk"],
            version=self.kwargs["version"],
        )
        context.update(
            model=version.model,
            obj=version,
            text=blocks(version.text),
            tbp=summary.TO_BE_PROVIDED,
            v=_version_context(version, summary.previous(version)),
        )
        return context
