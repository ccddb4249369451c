"""POST /api/v1/alertmanager: Alertmanager's webhook (payload version 4). Each alert becomes a
finding (fingerprint from Alertmanager); resolved alerts clear theirs; Alertmanager's repeats
(every repeat_interval) change nothing."""

from __future__ import annotations

import re
from datetime import datetime
from typing import Literal

import msgspec
from django.conf import settings
from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import OpenApiResponse, extend_schema
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from console.authentication import AgentTokenAuthentication
from console.permissions import IsAgent
from incidents.services.engine import clear_finding, raise_finding

MAX_BYTES = 2 * 1024 * 1024
_PATH = re.compile(r"at `\$(?:\.(\w+))?(?:\[(\d+)\])?(?:\.(\w+))?")
_FIELD = re.compile(r"(?:unknown|missing required) field `([^`]+)`")


class AlertIn(msgspec.Struct, rename=None):
    status: Literal["firing", "resolved"]
    labels: dict[str, str]
    startsAt: datetime
    fingerprint: str
    annotations: dict[str, str] = {}
    endsAt: datetime | None = None
    generatorURL: str = ""


class WebhookIn(msgspec.Struct):
    version: str
    groupKey: str
    status: Literal["firing", "resolved"]
    alerts: list[AlertIn]
    receiver: str = ""
    truncatedAlerts: int = 0
    groupLabels: dict[str, str] = {}
    commonLabels: dict[str, str] = {}
    commonAnnotations: dict[str, str] = {}
    externalURL: str = ""


_decoder = msgspec.json.Decoder(WebhookIn)


def _error(message: str, field: str | None = None, item: int | None = None) -> Response:
    body: dict[str, object] = {"error": message}
    if field:
        body["field"] = field
    if item is not None:
        body["item"] = item
    return Response(body, status=400)


def parse(body: bytes) -> WebhookIn | Response:
    try:
        payload = _decoder.decode(body)
    except msgspec.ValidationError as exc:
        text = str(exc)
        field = item = None
        if match := _PATH.search(text):
            item = int(match.group(2)) if match.group(2) else None
            field = ".".join(
                p for p in (match.group(1), f"[{item}]" if item is not None else None, match.group(3)) if p
            )
            field = field.replace(".[", "[")
        if match := _FIELD.search(text):
            field = f"{field}.{match.group(1)}" if field else match.group(1)
        return _error(f"Invalid Alertmanager payload: {text}", field, item)
    except msgspec.DecodeError as exc:
        return _error(f"Malformed JSON: {exc}")
    if payload.version != "4":
        return _error(f"Unsupported webhook version {payload.version!r}; this receiver takes version 4.", "version")
    for index, alert in enumerate(payload.alerts):
        if not alert.fingerprint.strip():
            return _error(f"alerts[{index}].fingerprint is empty.", f"alerts[{index}].fingerprint", index)
        if not alert.labels:
            return _error(f"alerts[{index}].labels is empty.", f"alerts[{index}].labels", index)
    return payload


class AlertmanagerWebhookView(APIView):
    authentication_classes = [AgentTokenAuthentication]
    permission_classes = [IsAgent]

    @extend_schema(
        request=OpenApiTypes.OBJECT,
        responses={
            200: OpenApiTypes.OBJECT,
            400: OpenApiResponse(description="Malformed payload; the body names the field"),
            401: OpenApiResponse(description="Missing or invalid token"),
        },
        description="Alertmanager webhook receiver (payload version 4). Configure a webhook_config with "
        "http_config.authorization.credentials set to an agent token.",
    )
    def post(self, request: Request) -> Response:
        if len(request.body) > MAX_BYTES:
            return Response({"error": f"Body larger than {MAX_BYTES} bytes."}, status=413)
        parsed = parse(request.body)
        if isinstance(parsed, Response):
            return parsed
        site = request.auth.site.name
        raised = cleared = 0
        for alert in parsed.alerts:
            fingerprint = f"alertmanager:{alert.fingerprint}"
            if alert.status == "resolved":
                clear_finding(fingerprint, source="alertmanager", at=alert.endsAt if _real(alert.endsAt) else None)
                cleared += 1
                continue
            labels = {"site": site, **alert.labels}
            raise_finding(
                fingerprint,
                labels,
                settings.ALERTMANAGER_SEVERITY_MAP.get(alert.labels.get("severity", ""), "SEV3"),
                alert.annotations.get("summary") or alert.labels.get("alertname", "Alertmanager alert"),
                alert.annotations.get("description", ""),
                source="alertmanager",
                group_key=f"alertmanager:{parsed.groupKey}",
                started_at=alert.startsAt,
                category=alert.labels.get("alertname", "alertmanager"),
            )
            raised += 1
        return Response({"firing": raised, "resolved": cleared})


def _real(moment: datetime | None) -> bool:
    """Alertmanager sends endsAt 0001-01-01T00:00:00Z while an alert fires."""
    return moment is not None and moment.year > 1
