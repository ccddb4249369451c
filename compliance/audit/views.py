"""The audit log page (filters, 50 entries a page, newest first, each with its field diff) and
its CSV export, streamed so that a large extract never sits in memory."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

from django.core.paginator import Paginator
from django.http import HttpRequest, HttpResponse, HttpResponseBadRequest, StreamingHttpResponse
from django.utils import timezone
from django.views import View
from django.views.generic import TemplateView

from compliance.audit.api import AuditEntryFilterSet
from compliance.choices import AuditAction
from compliance.models import AuditEntry
from compliance.permissions import ComplianceRequiredMixin
from compliance.services.audit import field_diff, record
from compliance.signals import AUDITED
from console import spreadsheet

PAGE_SIZE = 50
CSV_COLUMNS = [
    "at",
    "actor",
    "actor_id",
    "action",
    "app_label",
    "model",
    "object_id",
    "object_repr",
    "message",
    "remote_addr",
    "before",
    "after",
]


def _filtered(request: HttpRequest) -> AuditEntryFilterSet:
    return AuditEntryFilterSet(request.GET, queryset=AuditEntry.objects.order_by("-at", "-pk"))


def _object_types() -> list[tuple[str, str]]:
    """(model name as stored, "app.Model") for the type filter: what the signals audit."""
    return sorted({(label.split(".")[1].lower(), label) for label in AUDITED}, key=lambda t: t[1])


class AuditLogView(ComplianceRequiredMixin, TemplateView):
    template_name = "compliance/audit/list.html"

    def get_context_data(self, **kwargs: Any) -> dict[str, Any]:
        context = super().get_context_data(**kwargs)
        filterset = _filtered(self.request)
        queryset = filterset.qs if filterset.is_valid() else AuditEntry.objects.none()
        page = Paginator(queryset, PAGE_SIZE).get_page(self.request.GET.get("page"))
        page.object_list = list(page.object_list)
        for entry in page.object_list:
            entry.diff = field_diff(entry)
        query = self.request.GET.copy()
        query.pop("page", None)
        context.update(
            filter=filterset,
            page=page,
            query=query.urlencode(),
            actions=AuditAction.choices,
            object_types=_object_types(),
            params=self.request.GET,
        )
        return context


class _Echo:
    """A file-like whose write returns the line, for csv.writer feeding a streaming response."""

    def write(self, value: str) -> str:
        return value


def _csv_lines(entries: Any) -> Iterator[str]:
    writer = spreadsheet.writer(_Echo())
    yield writer.writerow(CSV_COLUMNS)
    for e in entries.iterator(chunk_size=2000):
        yield writer.writerow(
            [
                e.at.isoformat(),
                e.actor,
                e.actor_id if e.actor_id is not None else "",
                e.action,
                e.app_label,
                e.model,
                e.object_id,
                e.object_repr,
                e.message,
                e.remote_addr or "",
                json.dumps(e.before, sort_keys=True) if e.before is not None else "",
                json.dumps(e.after, sort_keys=True) if e.after is not None else "",
            ]
        )


class AuditExportView(ComplianceRequiredMixin, View):
    """The filtered set as CSV. The export is itself an entry, written before the first line."""

    def get(self, request: HttpRequest) -> HttpResponse:
        filterset = _filtered(request)
        if not filterset.is_valid():
            errors = "; ".join(f"{name}: {' '.join(msgs)}" for name, msgs in filterset.errors.items())
            return HttpResponseBadRequest(errors, content_type="text/plain")
        filters = {k: v for k, v in filterset.form.cleaned_data.items() if v not in (None, "")}
        summary = ", ".join(f"{k}={v}" for k, v in filters.items()) or "no filters"
        record(AuditAction.EXPORT, message=f"audit CSV exported ({summary})")
        response = StreamingHttpResponse(_csv_lines(filterset.qs), content_type="text/csv")
        stamp = timezone.localtime().strftime("%Y%m%d-%H%M%S")
        response["Content-Disposition"] = f'attachment; filename="audit-{stamp}.csv"'
        return response
