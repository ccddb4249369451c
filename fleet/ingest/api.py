"""The ingest doors: JSON GPU-sample batches and Prometheus text. Both validate the whole request
first (400 naming the item or line, nothing written), then queue it with an idempotency key."""

from __future__ import annotations

from datetime import datetime
from typing import Any

import redis
from django.conf import settings
from django.utils import timezone
from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import OpenApiParameter, OpenApiResponse, extend_schema, inline_serializer
from kombu.exceptions import OperationalError as BrokerError
from rest_framework import serializers
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from console import counters
from console.api import unavailable
from console.authentication import AgentTokenAuthentication
from console.permissions import IsAgent
from console.queues import queue_depth
from fleet import exporters
from fleet.ingest import push_queue, remote_write
from fleet.ingest import stream as ingest_stream
from fleet.ingest.batches import ScopeCheck, batch_key, check_site_scope, parse_gpu_batch
from fleet.ingest.prometheus import (
    IGNORED_NAMES_SHOWN,
    KINDS,
    check_node_scope,
    check_scope,
    exposition_key,
    held_hosts,
    node_scope_check,
    packed,
    parse_exposition,
    unpacked,
)
from fleet.ingest.tasks import ingest_prometheus_batch
from fleet.telemetry.store import store_gpu_samples
from fleet.validation import IngestError, read_body, rejected

QUEUE_FULL_RETRY_AFTER = 2

COMMON_RESPONSES = {
    400: OpenApiResponse(description="Invalid input; the body names the item (or line) and field"),
    401: OpenApiResponse(description="Missing or invalid agent token"),
    403: OpenApiResponse(description="The request writes GPUs or nodes an Admin kept with another site"),
    409: OpenApiResponse(
        description="Samples of another site's GPUs or nodes held back while an Admin resolves the claim; "
        "the rest of the request was accepted (see held_back). node_exporter series of another site's "
        "hosts: 409 only when nothing else was accepted, else 202 naming them in held_back"
    ),
    413: OpenApiResponse(description="Too many samples or too many bytes"),
    415: OpenApiResponse(description="The body is not in the format this door takes"),
    429: OpenApiResponse(description="The ingest queue is full; retry after Retry-After seconds"),
    503: OpenApiResponse(description="Broker or database unavailable; retry after Retry-After seconds"),
}


# The text exposition formats, as Prometheus asks for them in its Accept header.
EXPOSITION_TYPES = ("text/plain", "application/openmetrics-text")


def check_content_type(content_type: str) -> bool:
    """Is the body OpenMetrics text (else the 0.0.4 text format)? 415 for a body that is not text
    exposition (JSON, protobuf, a form). No Content-Type at all is taken as 0.0.4 text: the
    oldest push scripts send none."""
    media_type = content_type.split(";", 1)[0].strip().lower()
    if media_type and media_type not in EXPOSITION_TYPES:
        raise IngestError(
            415,
            f"Content-Type {media_type} is not the Prometheus text exposition format; send "
            f"{' or '.join(EXPOSITION_TYPES)} (curl: -H 'Content-Type: text/plain; version=0.0.4').",
            field="Content-Type",
        )
    return media_type == "application/openmetrics-text"


def admit() -> Response | None:
    """Back-pressure, before any work: 429 when the queue is over its bound, 503 when it is down."""
    try:
        depth = queue_depth()
    except redis.RedisError as exc:
        counters.increment("goodput_ingest_rejected_total", reason="broker_down")
        return unavailable(f"The ingest queue is unavailable ({exc.__class__.__name__}); retry later.")
    if depth >= settings.INGEST_QUEUE_BOUND:
        counters.increment("goodput_ingest_rejected_total", reason="queue_full")
        response = Response(
            {"error": f"The ingest queue holds {depth} batches (bound {settings.INGEST_QUEUE_BOUND}); retry later."},
            status=429,
        )
        response["Retry-After"] = str(QUEUE_FULL_RETRY_AFTER)
        return response
    return None


def dispatch(site_id: int, key: str, payload: bytes, samples: int, options: dict[str, Any]) -> Response | None:
    """Queue a validated Prometheus push (its parsed values, prometheus.packed, of ``samples``
    samples) for the writers (fleet.ingest.push_queue); a 503 Response when the queue is down.
    Eager mode (embedded, no broker) stores it here and now."""
    received = datetime.fromisoformat(options["now"])
    if settings.EAGER_TASKS:
        ingest_prometheus_batch.apply_async(args=[site_id, key, payload, options, options["now"]])
        return None
    try:
        push_queue.enqueue(
            site_id=site_id,
            key=key,
            payload=payload,
            options=options,
            samples=samples,
            enqueued_at=received,
        )
    except (BrokerError, redis.RedisError, OSError) as exc:
        counters.increment("goodput_ingest_rejected_total", reason="broker_down")
        return unavailable(f"The ingest queue is unavailable ({exc.__class__.__name__}); retry later.")
    return None


def queue_gpu_batch(site_id: int, key: str, scope: ScopeCheck) -> Response | None:
    """Hand a validated GPU batch (what its scope check kept) to the writers (the ingest stream);
    a 503 Response when the queue is down. Eager mode (embedded, no broker) writes it here and now."""
    samples = scope.samples
    if settings.EAGER_TASKS:
        store_gpu_samples(site_id=site_id, batch_key=key, samples=samples, enqueued_at=timezone.now())
        return None
    try:
        ingest_stream.enqueue(site_id=site_id, key=key, samples=samples, enqueued_at=timezone.now(), gpus=scope.gpus)
    except (BrokerError, redis.RedisError, OSError) as exc:
        counters.increment("goodput_ingest_rejected_total", reason="broker_down")
        return unavailable(f"The ingest queue is unavailable ({exc.__class__.__name__}); retry later.")
    return None


def held_back(scope: ScopeCheck, accepted: dict[str, Any], batch: str | None) -> Response:
    """The answer when claims held samples back (fleet.inventory.claims): 409 while a claim is
    pending (403 once kept with its owner), naming each value; the rest of the request, counted
    in ``accepted``, was queued under ``batch``."""
    refusal = scope.refusal()
    counters.increment("goodput_ingest_rejected_total", reason="claim_conflict")
    body = {**refusal.as_dict(), **accepted, "batch": batch, "held_back": [h.as_dict() for h in scope.held]}
    return Response(body, status=refusal.status)


def accepted_but_hosts_held(hosts: ScopeCheck, accepted: dict[str, Any], batch: str) -> Response:
    """The answer when only node_exporter series of another site's hosts were held back and the
    rest was queued: 202, naming the hosts (and their claims) as the GPU doors' 409 does."""
    counters.increment("goodput_ingest_rejected_total", reason="claim_conflict")
    return Response({**accepted, "batch": batch, "held_back": [h.as_dict() for h in hosts.held]}, status=202)


class IngestHeldValueSerializer(serializers.Serializer):
    """One GPU or host held back by a claim (claims.Held.as_dict), in the schema."""

    field = serializers.CharField(help_text="gpu_uuid or hostname")
    value = serializers.CharField()
    conflict = serializers.IntegerField(help_text="the claim's id")
    state = serializers.ChoiceField(choices=["pending", "kept"])
    detail = serializers.CharField()

    class Meta:
        ref_name = "IngestHeldValue"


# accepted_but_hosts_held's answer at this door.
REMOTE_WRITE_HELD = inline_serializer(
    "RemoteWriteHostsHeld",
    {
        "gpu_samples": serializers.IntegerField(),
        "serving_samples": serializers.IntegerField(),
        "ignored": serializers.IntegerField(),
        "batch": serializers.CharField(),
        "held_back": IngestHeldValueSerializer(many=True),
    },
)


NOTHING_ACCEPTED = {"gpu_samples": 0, "serving_samples": 0, "node_samples": 0, "scheduler_samples": 0}


class GpuSampleIngestView(APIView):
    """Accept a JSON batch of GPU samples from an agent; 202 once it is queued."""

    authentication_classes = [AgentTokenAuthentication]
    permission_classes = [IsAgent]

    @extend_schema(
        request=inline_serializer("GpuSampleBatch", {"samples": serializers.ListField(child=serializers.DictField())}),
        parameters=[OpenApiParameter("Idempotency-Key", OpenApiTypes.STR, OpenApiParameter.HEADER, required=False)],
        responses={
            202: inline_serializer(
                "IngestAccepted", {"accepted": serializers.IntegerField(), "batch": serializers.CharField()}
            ),
            **COMMON_RESPONSES,
        },
    )
    def post(self, request: Request) -> Response:
        token = request.auth
        refused = admit()
        if refused is not None:
            return refused
        try:
            body = read_body(request)
            batch = parse_gpu_batch(body)
            scope = check_site_scope(batch, site_id=token.site_id)
            key = batch_key(site_id=token.site_id, body=body, idempotency_key=request.headers.get("Idempotency-Key"))
        except IngestError as exc:
            return rejected(exc)
        if scope.samples:
            refused = queue_gpu_batch(token.site_id, key, scope)
            if refused is not None:
                return refused
            counters.increment("goodput_ingest_accepted_total", kind="gpu_samples")
        if scope.held:
            return held_back(scope, {"accepted": len(scope.samples)}, key if scope.samples else None)
        return Response({"accepted": len(scope.samples), "batch": key}, status=202)


class PrometheusIngestView(APIView):
    """Accept a Prometheus text exposition (a dcgm-exporter, vLLM, Triton, TGI, node_exporter,
    Kueue, kube-state-metrics or Slurm exporter scrape) as is.

    Query parameters: ``hostname`` for GPU metrics without a hostname label, ``endpoint`` to
    file serving metrics under a name other than the model label, ``kind`` to keep only one
    family of metrics (auto, dcgm, vllm, triton, tgi, node).
    """

    authentication_classes = [AgentTokenAuthentication]
    permission_classes = [IsAgent]

    @extend_schema(
        request={"text/plain": OpenApiTypes.STR},
        parameters=[
            OpenApiParameter("hostname", OpenApiTypes.STR, required=False),
            OpenApiParameter("endpoint", OpenApiTypes.STR, required=False),
            OpenApiParameter("kind", OpenApiTypes.STR, enum=list(KINDS), required=False),
            OpenApiParameter("Idempotency-Key", OpenApiTypes.STR, OpenApiParameter.HEADER, required=False),
        ],
        responses={
            202: inline_serializer(
                "PrometheusAccepted",
                {
                    # A push of only series another app maps (Velero's) answers {ignored, mapped}.
                    "gpu_samples": serializers.IntegerField(required=False),
                    "serving_samples": serializers.IntegerField(required=False),
                    "node_samples": serializers.IntegerField(required=False),
                    "scheduler_samples": serializers.IntegerField(required=False),
                    "ignored": serializers.IntegerField(),
                    "ignored_metrics": serializers.DictField(child=serializers.IntegerField(), required=False),
                    # What the table's PUSH entries (fleet.exporters.map_pushes) took from the push, by exporter.
                    "mapped": inline_serializer(
                        "PrometheusMapped",
                        {
                            "velero": inline_serializer(
                                "VeleroMapped",
                                {
                                    "backup_reports": serializers.IntegerField(),
                                    "schedules": serializers.IntegerField(),
                                    "unmapped_schedules": serializers.ListField(child=serializers.CharField()),
                                },
                                required=False,
                            )
                        },
                        required=False,
                    ),
                    "batch": serializers.CharField(required=False),
                    "held_back": IngestHeldValueSerializer(
                        many=True, required=False, help_text="Another site's hosts, not written"
                    ),
                },
            ),
            **COMMON_RESPONSES,
        },
    )
    def post(self, request: Request) -> Response:
        token = request.auth
        refused = admit()
        if refused is not None:
            return refused
        options = {
            "hostname": request.query_params.get("hostname") or None,
            "endpoint": request.query_params.get("endpoint") or None,
            "kind": request.query_params.get("kind", "auto"),
            "now": timezone.now().isoformat(),
        }
        try:
            options["openmetrics"] = openmetrics = check_content_type(request.META.get("CONTENT_TYPE", ""))
            body = read_body(request)
            try:
                text = body.decode("utf-8")
            except UnicodeDecodeError as exc:
                raise IngestError(400, f"The body is not UTF-8 text ({exc}).") from None
            exposition = parse_exposition(text, **options)
            # Series mapped from the push as a whole (Velero's: fleet.exporters.PUSH), before the count check.
            mapped = exporters.map_pushes(
                text,
                exposition.ignored_metrics,
                site_id=token.site_id,
                received=timezone.now(),
                openmetrics=openmetrics,
            )
            del text  # the parse holds what is queued: the text need not be held beside it
            if not exposition.count and mapped:
                return Response({"ignored": exposition.ignored, "mapped": mapped}, status=202)
            if not exposition.count:
                raise IngestError(
                    400, "No GPU or serving metrics (nor node_exporter or scheduler series) found in the exposition."
                )
            # Another site's GPUs or hosts: claims, and their samples and series taken out.
            scope = check_scope(exposition, site_id=token.site_id)
            hosts = check_node_scope([exposition], site_id=token.site_id)
            held = scope.joined(hosts) if scope is not None else hosts
            if held is not None and not exposition.count:  # all held back: 409 (403 once kept with its owner)
                return held_back(held, NOTHING_ACCEPTED, None)
            key = exposition_key(
                site_id=token.site_id,
                body=body,
                idempotency_key=request.headers.get("Idempotency-Key"),
                options=options,
                timestamped=exposition.timestamped,
            )
        except IngestError as exc:
            return rejected(exc)
        refused = dispatch(token.site_id, key, packed(exposition), exposition.count, options)
        if refused is not None:
            return refused
        counters.increment("goodput_ingest_accepted_total", kind="prometheus")
        accepted = {
            "gpu_samples": len(exposition.gpu_samples),
            "serving_samples": len(exposition.serving),
            "node_samples": len(exposition.node),
            "scheduler_samples": len(exposition.scheduler),
            "ignored": exposition.ignored,
            "ignored_metrics": dict(exposition.ignored_metrics.most_common(IGNORED_NAMES_SHOWN)),
            **({"mapped": mapped} if mapped else {}),
        }
        if scope is not None:
            return held_back(scope.joined(hosts), accepted, key)
        if hosts is not None:
            return accepted_but_hosts_held(hosts, accepted, key)
        return Response({**accepted, "batch": key}, status=202)


REMOTE_WRITE_TYPE = "application/x-protobuf"


def check_remote_write_headers(content_type: str, content_encoding: str) -> None:
    """415 for anything but remote_write 1.0's snappy-compressed prometheus.WriteRequest (a 2.0
    sender told 415 falls back to 1.0). Missing headers are taken as 1.0: curl replays send none."""
    media_type, _, params = content_type.partition(";")
    media_type = media_type.strip().lower()
    proto = dict(
        (k.strip().lower(), v.strip()) for k, _, v in (p.partition("=") for p in params.split(";")) if k.strip()
    ).get("proto", "prometheus.WriteRequest")
    if media_type and (media_type != REMOTE_WRITE_TYPE or proto != "prometheus.WriteRequest"):
        raise IngestError(
            415,
            f"Content-Type {content_type.strip()[:100]} is not remote_write 1.0; send {REMOTE_WRITE_TYPE} "
            "(a snappy-compressed prometheus.WriteRequest).",
            field="Content-Type",
        )
    encoding = content_encoding.strip().lower()
    if encoding and encoding != "snappy":
        raise IngestError(
            415, f"Content-Encoding {encoding[:40]} is not snappy, the one remote_write uses.", field="Content-Encoding"
        )


class PrometheusRemoteWriteView(APIView):
    """Prometheus remote_write 1.0 (snappy-compressed protobuf WriteRequest): the same mapping as
    the text door, 204 once queued. Retries store nothing twice (each timestamp's exposition is
    keyed by its hash); 400 (which remote_write drops) names what is malformed, 413 a request that
    expands past its bounds (remote_write.read); 429 and 503 carry Retry-After, which remote_write
    honours. Query parameters as for the text door.

    Every exposition is checked before any is queued (nothing half-written); meanwhile only their
    packed parse is kept, one exposition's text at a time."""

    authentication_classes = [AgentTokenAuthentication]
    permission_classes = [IsAgent]

    @extend_schema(
        request={REMOTE_WRITE_TYPE: OpenApiTypes.BINARY},
        parameters=[
            OpenApiParameter("hostname", OpenApiTypes.STR, required=False),
            OpenApiParameter("endpoint", OpenApiTypes.STR, required=False),
            OpenApiParameter("kind", OpenApiTypes.STR, enum=list(KINDS), required=False),
        ],
        responses={
            202: OpenApiResponse(
                REMOTE_WRITE_HELD, description="Queued, less the series of another site's hosts (see held_back)"
            ),
            204: OpenApiResponse(description="Queued (or nothing in it this console maps)"),
            **COMMON_RESPONSES,
        },
    )
    def post(self, request: Request) -> Response:
        token = request.auth
        refused = admit()
        if refused is not None:
            return refused
        options = {
            "hostname": request.query_params.get("hostname") or None,
            "endpoint": request.query_params.get("endpoint") or None,
            "kind": request.query_params.get("kind", "auto"),
            "now": timezone.now().isoformat(),
            "openmetrics": False,
        }
        # (batch key, packed parse, samples, its node_exporter hosts): only the packed parse is kept
        # while the rest are read, one exposition's text at a time.
        queued: list[tuple[str, bytes, int, frozenset[str]]] = []
        held: ScopeCheck | None = None  # another site's GPUs: 409, as the text door
        counts = {"gpu_samples": 0, "serving_samples": 0}
        ignored = 0
        try:
            check_remote_write_headers(
                request.META.get("CONTENT_TYPE", ""), request.META.get("HTTP_CONTENT_ENCODING", "")
            )
            for chunk in remote_write.read(read_body(request)).chunks():
                try:
                    exposition = parse_exposition(chunk.text, **options)
                except IngestError as exc:
                    raise chunk.translated(exc) from None
                ignored += exposition.ignored
                scope = check_scope(exposition, site_id=token.site_id)
                if scope is not None:
                    held = scope if held is None else held.joined(scope)
                if not exposition.count:
                    continue
                counts["gpu_samples"] += len(exposition.gpu_samples)
                counts["serving_samples"] += len(exposition.serving)
                key = exposition_key(
                    site_id=token.site_id, body=chunk.text, idempotency_key=None, options=options, timestamped=True
                )
                hostnames = frozenset(p.hostname for p in exposition.node)
                queued.append((key, packed(exposition), exposition.count, hostnames))
            # Once for the whole request: one sighting a host, as the text door; the expositions
            # that carry a held-back host are unpacked and packed again without its series.
            foreign = held_hosts(set().union(*(entry[3] for entry in queued)), site_id=token.site_id)
            hosts = node_scope_check(foreign)
            if foreign:
                kept = []
                for key, payload, samples, hostnames in queued:
                    if hostnames & foreign.keys():
                        exposition = unpacked(payload, options)
                        exposition.node = [p for p in exposition.node if p.hostname not in foreign]
                        payload, samples = packed(exposition), exposition.count
                    if samples:
                        kept.append((key, payload, samples, hostnames))
                queued = kept
        except IngestError as exc:
            return rejected(exc)
        for key, payload, samples, _ in queued:
            refused = dispatch(token.site_id, key, payload, samples, options)
            if refused is not None:
                return refused  # a retry re-queues what went before under the same keys: stored once
        if queued:
            counters.increment("goodput_ingest_accepted_total", kind="prometheus_remote_write")
        if ignored:
            counters.increment("goodput_ingest_ignored_total", ignored, door="prometheus_remote_write")
        if held is not None:
            return held_back(held.joined(hosts), {**counts, "ignored": ignored}, queued[0][0] if queued else None)
        if hosts is not None and not queued:  # another site's hosts only: 409, as the text door
            return held_back(hosts, {**counts, "ignored": ignored}, None)
        if hosts is not None:
            return accepted_but_hosts_held(hosts, {**counts, "ignored": ignored}, queued[0][0])
        return Response(status=204)
