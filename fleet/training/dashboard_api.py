"""The training pages' read APIs: the goodput overview and one job's snapshot. Any role reads
them (a session or a personal token); the pages fetch them on load and after a reconnect."""

from __future__ import annotations

from collections.abc import Callable
from datetime import timedelta
from typing import Any

from django.shortcuts import get_object_or_404
from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import OpenApiParameter, extend_schema
from rest_framework import serializers
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from console.ranges import WINDOW_PARAMETERS, RangeError, window_from_query
from fleet.training import read as training_read
from fleet.training.models import Job
from fleet.training.serializers import (
    JobSnapshotAnswerSerializer,
    TrainingOverviewAnswerSerializer,
    snapshot_part_serializers,
)

# Each preset in hours (whole clock hours: see fleet.training.read); a custom window is both of
# from / to, ISO 8601 (UTC without an offset), read in whole hours (console.ranges).
PRESETS = {key: timedelta(hours=hours) for key, hours in training_read.RANGES.items()}

# Parts the rooms above training add to a job's snapshot (fleet.correlation's ``episodes``), by
# key, registered from their plugins.py (training cannot import them).
_job_snapshot_parts: dict[str, Callable[[Job], Any]] = {}


def register_job_snapshot_part(key: str, part: Callable[[Job], Any], *, described_by: serializers.Field) -> None:
    """Add ``key`` to every job snapshot, its value ``part(job)``; ``described_by`` types it in the schema."""
    _job_snapshot_parts[key] = part
    snapshot_part_serializers[key] = described_by


class TrainingOverviewView(APIView):
    """Cluster goodput over whole clock hours ending with the current one ("1h" is the current hour
    so far, "24h" and "7d" the last 24 and 168 hourly buckets; each with ``since``, its first hour),
    the badput breakdown and hourly stacked series for the range, the top jobs by GPU-hours lost,
    and the jobs holding GPUs with their step rate."""

    @extend_schema(
        parameters=[
            OpenApiParameter(
                "range",
                OpenApiTypes.STR,
                enum=list(training_read.RANGES),
                default=training_read.DEFAULT_RANGE,
            ),
            *WINDOW_PARAMETERS,
        ],
        responses=TrainingOverviewAnswerSerializer,
    )
    def get(self, request: Request) -> Response:
        try:
            window = window_from_query(request.query_params, presets=PRESETS, default=training_read.DEFAULT_RANGE)
        except RangeError as exc:
            return Response(exc.as_dict(), status=400)
        return Response(
            training_read.overview_snapshot(range_key=window.preset or training_read.DEFAULT_RANGE, window=window)
        )


class JobSnapshotView(APIView):
    """A job's page: its account (exact from every event; for a job of over 50,000 events from its
    hourly accounts, ``exact`` false, as of their last refresh), event timeline, per-minute step
    and GPU series, chart markers, the losses of its failures, and the checkpoint advisor."""

    queryset = Job.objects.all()  # reads need fleet.view_job, as the job's own detail route does

    @extend_schema(parameters=WINDOW_PARAMETERS, responses=JobSnapshotAnswerSerializer)
    def get(self, request: Request, pk: int) -> Response:
        # The job's own window (its last 24 hours) unless from / to ask for another.
        window = None
        if "from" in request.query_params or "to" in request.query_params:
            try:
                window = window_from_query(request.query_params, presets={}, default="")
            except RangeError as exc:
                return Response(exc.as_dict(), status=400)
        job = get_object_or_404(Job.objects.select_related("site"), pk=pk)
        snapshot = training_read.job_snapshot(job, window=window)
        for key, part in _job_snapshot_parts.items():
            snapshot[key] = part(job)
        return Response(snapshot)
