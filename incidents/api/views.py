from __future__ import annotations

from typing import Any

from django.db import transaction
from drf_spectacular.utils import extend_schema
from rest_framework import mixins, status, viewsets
from rest_framework.decorators import action
from rest_framework.request import Request
from rest_framework.response import Response

from incidents.api.serializers import (
    ActionItemSerializer,
    IncidentSerializer,
    NoteSerializer,
    NotificationChannelSerializer,
    PostmortemSerializer,
    RoleSerializer,
    SilenceSerializer,
    TimelineEntrySerializer,
    TransitionSerializer,
)
from incidents.filtersets import ActionItemFilterSet, IncidentFilterSet, SilenceFilterSet, TimelineEntryFilterSet
from incidents.models import ActionItem, Incident, NotificationChannel, Silence, TimelineEntry
from incidents.services import engine
from incidents.services.engine import Actor, TransitionError

READ = ["incidents.view_incident"]
ACT = ["incidents.change_incident"]


class IncidentViewSet(viewsets.ReadOnlyModelViewSet):
    """Incidents are opened by findings (detectors, Alertmanager); people move them along."""

    queryset = Incident.objects.select_related("commander", "scribe", "communications").prefetch_related("findings")
    serializer_class = IncidentSerializer
    filterset_class = IncidentFilterSet
    ordering_fields = ["detected_at", "severity", "state"]
    required_permissions = {"GET": READ, "HEAD": READ, "OPTIONS": READ, "POST": ACT, "PUT": ACT, "PATCH": ACT}

    def _actor(self, request: Request) -> Actor:
        return Actor.person(request.user)

    def _move(self, request: Request, fn: Any) -> Response:
        serializer = TransitionSerializer(data=request.data)
        serializer.is_valid(raise_exception=True)
        try:
            incident = fn(self.get_object(), actor=self._actor(request), note=serializer.validated_data["note"])
        except TransitionError as exc:
            return Response({"error": str(exc)}, status=status.HTTP_409_CONFLICT)
        return Response(IncidentSerializer(incident).data)

    @extend_schema(request=TransitionSerializer, responses=IncidentSerializer)
    @action(detail=True, methods=["post"])
    def acknowledge(self, request: Request, pk: str | None = None, **kwargs: Any) -> Response:
        return self._move(request, engine.acknowledge_incident)

    @extend_schema(request=TransitionSerializer, responses=IncidentSerializer)
    @action(detail=True, methods=["post"])
    def mitigate(self, request: Request, pk: str | None = None, **kwargs: Any) -> Response:
        return self._move(request, engine.mitigate_incident)

    @extend_schema(request=TransitionSerializer, responses=IncidentSerializer)
    @action(detail=True, methods=["post"])
    def resolve(self, request: Request, pk: str | None = None, **kwargs: Any) -> Response:
        return self._move(request, engine.resolve_incident)

    @extend_schema(request=NoteSerializer, responses=TimelineEntrySerializer)
    @action(detail=True, methods=["post"])
    def notes(self, request: Request, pk: str | None = None, **kwargs: Any) -> Response:
        serializer = NoteSerializer(data=request.data)
        serializer.is_valid(raise_exception=True)
        entry = engine.add_note(self.get_object(), text=serializer.validated_data["text"], actor=self._actor(request))
        return Response(TimelineEntrySerializer(entry).data, status=status.HTTP_201_CREATED)

    @extend_schema(request=RoleSerializer, responses=IncidentSerializer)
    @action(detail=True, methods=["post"])
    def roles(self, request: Request, pk: str | None = None, **kwargs: Any) -> Response:
        serializer = RoleSerializer(data=request.data)
        serializer.is_valid(raise_exception=True)
        incident = engine.assign_role(
            self.get_object(),
            role=serializer.validated_data["role"],
            user=serializer.validated_data["username"],
            actor=self._actor(request),
        )
        return Response(IncidentSerializer(incident).data)

    @extend_schema(request=PostmortemSerializer, responses=IncidentSerializer)
    @action(detail=True, methods=["put", "patch"])
    def postmortem(self, request: Request, pk: str | None = None, **kwargs: Any) -> Response:
        serializer = PostmortemSerializer(data=request.data, partial=request.method == "PATCH")
        serializer.is_valid(raise_exception=True)
        incident = engine.save_postmortem(self.get_object(), actor=self._actor(request), **serializer.validated_data)
        return Response(IncidentSerializer(incident).data)


class TimelineEntryViewSet(mixins.ListModelMixin, mixins.RetrieveModelMixin, viewsets.GenericViewSet):
    """Append-only; add notes with POST /incidents/{id}/notes/."""

    queryset = TimelineEntry.objects.all()
    serializer_class = TimelineEntrySerializer
    filterset_class = TimelineEntryFilterSet


class ActionItemViewSet(
    mixins.ListModelMixin,
    mixins.RetrieveModelMixin,
    mixins.CreateModelMixin,
    mixins.UpdateModelMixin,
    viewsets.GenericViewSet,
):
    queryset = ActionItem.objects.select_related("owner", "incident")
    serializer_class = ActionItemSerializer
    filterset_class = ActionItemFilterSet

    def perform_create(self, serializer: ActionItemSerializer) -> None:
        data = serializer.validated_data
        serializer.instance = engine.add_action_item(
            data["incident"],
            title=data["title"],
            owner=data.get("owner"),
            due_date=data.get("due_date"),
            actor=Actor.person(self.request.user),
        )

    def perform_update(self, serializer: ActionItemSerializer) -> None:
        data = dict(serializer.validated_data)
        data.pop("incident", None)  # an action item stays with its incident
        serializer.instance = engine.update_action_item(
            serializer.instance, actor=Actor.person(self.request.user), **data
        )


class SilenceViewSet(viewsets.ModelViewSet):
    queryset = Silence.objects.select_related("created_by")
    serializer_class = SilenceSerializer
    filterset_class = SilenceFilterSet

    def perform_create(self, serializer: SilenceSerializer) -> None:
        with transaction.atomic():
            serializer.save(created_by=self.request.user)


class NotificationChannelViewSet(viewsets.ModelViewSet):
    queryset = NotificationChannel.objects.all()
    serializer_class = NotificationChannelSerializer
