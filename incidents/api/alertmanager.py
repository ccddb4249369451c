"""POST /api/v1/alertmanager: Alertmanager's webhook (payload version 4). Each alert becomes a
finding (fingerprint from Alertmanager); resolved alerts clear theirs; Alertmanager's repeats
(every repeat_interval) change nothing.

An agent token belongs to one site, and so does everything its Alertmanager raises. Fingerprints
and group keys are unique within one Alertmanager, not across the sites that post here, so both
are namespaced by the token's site: another site's findings and incidents are out of reach, and
the ``site`` label is the token's, whatever the payload says. A payload is checked whole before
anything is written, and written in one transaction.
"""

from __future__ import annotations

import hashlib
import re
from datetime import UTC, datetime, timedelta
from typing import Annotated, Literal

import msgspec
from django.conf import settings
from django.db import transaction
from django.utils import timezone
from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import OpenApiResponse, extend_schema, inline_serializer
from rest_framework import serializers
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from console.authentication import AgentTokenAuthentication
from console.models import AgentToken
from console.parsers import MAX_DEPTH, too_deep
from console.permissions import IsAgent
from incidents.models import Finding, Incident
from incidents.services.engine import Actor, clear_finding, raise_finding

SOURCE = "alertmanager"
MAX_BYTES = 2 * 1024 * 1024
# Alertmanager's endsAt for an alert that still fires ("no end"); any other time is checked.
ZERO_TIME = datetime(1, 1, 1, tzinfo=UTC)
_PATH = re.compile(r"at `\$(?:\.(\w+))?(?:\[(\d+)\])?(?:\.(\w+))?")
_FIELD = re.compile(r"(?:unknown|missing required) field `([^`]+)`")


def namespaced(site_id: int, key: str) -> str:
    """A fingerprint or group key of Alertmanager as one site's (the id ends at the colon, so no
    two sites' keys can be equal)."""
    return f"{SOURCE}:site-{site_id}:{key}"


# What Alertmanager's identities may take of their columns, leaving room for any site's namespace.
_NAMESPACE = len(namespaced(2**63 - 1, ""))
FINGERPRINT_MAX = Finding._meta.get_field("fingerprint").max_length - _NAMESPACE  # type: ignore[operator]
GROUP_KEY_MAX = Incident._meta.get_field("group_key").max_length - _NAMESPACE  # type: ignore[operator]
ALERTNAME_MAX = Incident._meta.get_field("category").max_length  # the alertname is the incident's category

# RFC 3339 times carry an offset; a naive one would be read in the console's zone, silently.
Moment = Annotated[datetime, msgspec.Meta(tz=True)]


class AlertIn(msgspec.Struct, rename=None):
    status: Literal["firing", "resolved"]
    labels: dict[str, str]
    startsAt: Moment
    fingerprint: str
    annotations: dict[str, str] = {}
    endsAt: Moment | None = None
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


class PayloadError(Exception):
    """A payload refused with 400; names the field (``alerts[2].startsAt``) and the alert's index."""

    def __init__(self, message: str, field: str | None = None, item: int | None = None) -> None:
        super().__init__(message)
        self.message, self.field, self.item = message, field, item

    def response(self) -> Response:
        body: dict[str, object] = {"error": self.message}
        if self.field:
            body["field"] = self.field
        if self.item is not None:
            body["item"] = self.item
        return Response(body, status=400)


def parse(body: bytes, *, now: datetime | None = None) -> WebhookIn:
    """Decode and check a whole payload; raise PayloadError naming the first fault.

    After this, every alert's times lie in the ingest window (endsAt is None for "no end"), and
    every string bound for a column fits it and holds no NUL (PostgreSQL refuses those).
    """
    if too_deep(body):  # before msgspec, which recurses into fields it skips (RecursionError near 1,000)
        raise PayloadError(f"Malformed JSON: nested deeper than {MAX_DEPTH} levels.")
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
        raise PayloadError(f"Invalid Alertmanager payload: {text}", field, item) from None
    except (msgspec.DecodeError, UnicodeDecodeError) as exc:  # msgspec lets bad UTF-8 through as is
        raise PayloadError(f"Malformed JSON: {exc}") from None
    if payload.version != "4":
        raise PayloadError(
            f"Unsupported webhook version {payload.version!r}; this receiver takes version 4.", "version"
        )
    if "\x00" in payload.groupKey:
        raise PayloadError("groupKey holds a NUL character.", "groupKey")
    now = now or timezone.now()
    oldest = now - timedelta(seconds=settings.ALERTMANAGER_MAX_AGE_SECONDS)
    newest = now + timedelta(seconds=settings.INGEST_MAX_FUTURE_SECONDS)
    for index, alert in enumerate(payload.alerts):
        _check_alert(alert, index)
        _check_time(alert.startsAt, index, "startsAt", oldest, newest)
        if alert.endsAt == ZERO_TIME:
            alert.endsAt = None
        elif alert.endsAt is not None:
            _check_time(alert.endsAt, index, "endsAt", oldest, newest)
    return payload


def _check_alert(alert: AlertIn, index: int) -> None:
    where = f"alerts[{index}]"
    if not alert.fingerprint.strip():
        raise PayloadError(f"{where}.fingerprint is empty.", f"{where}.fingerprint", index)
    # An identity is refused, never cut: two fingerprints alike in their first N characters would
    # become one finding. (Alertmanager's own are 16 hex digits.)
    if len(alert.fingerprint) > FINGERPRINT_MAX:
        raise PayloadError(
            f"{where}.fingerprint is {len(alert.fingerprint)} characters; at most {FINGERPRINT_MAX} are accepted.",
            f"{where}.fingerprint",
            index,
        )
    if not alert.labels:
        raise PayloadError(f"{where}.labels is empty.", f"{where}.labels", index)
    alertname = alert.labels.get("alertname", "")
    if len(alertname) > ALERTNAME_MAX:
        raise PayloadError(
            f"{where}.labels.alertname is {len(alertname)} characters; at most {ALERTNAME_MAX} are accepted.",
            f"{where}.labels.alertname",
            index,
        )
    strings = [("fingerprint", alert.fingerprint)]
    for name, mapping in (("labels", alert.labels), ("annotations", alert.annotations)):
        strings += [(name, key) for key in mapping]
        strings += [(f"{name}.{key}", value) for key, value in mapping.items()]
    for field, value in strings:
        if "\x00" in value:
            raise PayloadError(f"{where}.{field} holds a NUL character.", f"{where}.{field}", index)


def _check_time(moment: datetime, index: int, name: str, oldest: datetime, newest: datetime) -> None:
    # Compared as given, never converted: 0001-01-01T00:00:00+14:00 has no UTC form Python can hold.
    field = f"alerts[{index}].{name}"
    if moment > newest:
        raise PayloadError(
            f"{field} is {moment.isoformat()}, more than {settings.INGEST_MAX_FUTURE_SECONDS} s ahead of the "
            "console's clock (check Alertmanager's clock).",
            field,
            index,
        )
    if moment < oldest:
        raise PayloadError(
            f"{field} is {moment.isoformat()}, older than the {settings.ALERTMANAGER_MAX_AGE_SECONDS} s "
            "accepted (GOODPUT_ALERTMANAGER_MAX_AGE_SECONDS).",
            field,
            index,
        )


def receive(payload: WebhookIn, *, token: AgentToken) -> dict[str, int]:
    """Raise or clear one finding per alert, as the token's site's, in one transaction (a failure
    part-way leaves nothing written). Returns how many alerts fired and resolved.

    1. Fingerprints and the group key are namespaced by the token's site.
    2. The ``site`` label is the token's; a different one in the payload is kept as ``alert_site``.
    3. The timeline names the token and its site.
    """
    site = token.site
    actor = Actor(label=f"{SOURCE} (token {token.name}, site {site.name})", ref=f"agent-token:{token.key_id}")
    group_key = _group_key(site.pk, payload.groupKey)
    raised = cleared = 0
    with transaction.atomic():
        for alert in payload.alerts:
            fingerprint = namespaced(site.pk, alert.fingerprint)
            if alert.status == "resolved":
                clear_finding(fingerprint, source=SOURCE, at=alert.endsAt, actor=actor)
                cleared += 1
                continue
            raise_finding(
                fingerprint,
                _labels(alert.labels, site.name),
                settings.ALERTMANAGER_SEVERITY_MAP.get(alert.labels.get("severity", ""), "SEV3"),
                alert.annotations.get("summary") or alert.labels.get("alertname", "Alertmanager alert"),
                alert.annotations.get("description", ""),
                source=SOURCE,
                group_key=group_key,
                started_at=alert.startsAt,
                category=alert.labels.get("alertname", SOURCE),
                actor=actor,
            )
            raised += 1
    return {"firing": raised, "resolved": cleared}


def _group_key(site_id: int, group_key: str) -> str:
    """Alertmanager's group key as the site's. ``group_by: ['...']`` puts every label in the key,
    so a real one can outgrow the column: then its digest stands for it, whole (cut, two groups
    alike in their first characters would share incidents)."""
    if len(group_key) > GROUP_KEY_MAX:
        group_key = "sha256:" + hashlib.sha256(group_key.encode()).hexdigest()
    return namespaced(site_id, group_key)


def _labels(sent: dict[str, str], site: str) -> dict[str, str]:
    """The alert's labels with the token's site; a different ``site`` sent is kept, as ``alert_site``,
    for people to read (an Alertmanager may watch more than the site it posts for)."""
    labels = dict(sent)
    claimed = labels.pop("site", None)
    if claimed is not None and claimed != site:
        labels["alert_site"] = claimed
    return {"site": site, **labels}


class AlertmanagerWebhookView(APIView):
    authentication_classes = [AgentTokenAuthentication]
    permission_classes = [IsAgent]

    @extend_schema(
        request=OpenApiTypes.OBJECT,
        responses={
            200: inline_serializer(
                "AlertmanagerReceived",
                {
                    "firing": serializers.IntegerField(help_text="alerts raised or kept as findings"),
                    "resolved": serializers.IntegerField(help_text="alerts whose findings were cleared"),
                },
            ),
            400: OpenApiResponse(description="Malformed payload; the body names the field"),
            401: OpenApiResponse(description="Missing or invalid token"),
        },
        description="Alertmanager webhook receiver (payload version 4). Configure a webhook_config with "
        "http_config.authorization.credentials set to an agent token; its alerts become findings of the "
        "token's site.",
    )
    def post(self, request: Request) -> Response:
        if len(request.body) > MAX_BYTES:
            return Response({"error": f"Body larger than {MAX_BYTES} bytes."}, status=413)
        try:
            payload = parse(request.body)
        except PayloadError as exc:
            return exc.response()
        return Response(receive(payload, token=request.auth))
