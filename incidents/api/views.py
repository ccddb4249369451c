from __future__ import annotations

from typing import Any

from django.db import transaction
from django.utils import timezone
from drf_spectacular.utils import extend_schema
from rest_framework import mixins, status, viewsets
from rest_framework.decorators import action
from rest_framework.exceptions import APIException
from rest_framework.request import Request
from rest_framework.response import Response

from incidents.api.serializers import (
    ActionItemSerializer,
    IncidentSerializer,
    MaintenanceWindowSerializer,
    MergeSerializer,
    NoteSerializer,
    NotificationChannelSerializer,
    PostmortemSerializer,
    RoleSerializer,
    SeveritySerializer,
    SilenceFromIncidentSerializer,
    SilencePreviewSerializer,
    SilenceSerializer,
    TimelineEntrySerializer,
    TransitionSerializer,
)
from incidents.filtersets import ActionItemFilterSet, IncidentFilterSet, SilenceFilterSet, TimelineEntryFilterSet
from incidents.models import ActionItem, Incident, MaintenanceWindow, NotificationChannel, Silence, TimelineEntry
from incidents.services import actions, engine
from incidents.services.engine import Actor, TransitionError
from incidents.services.silences import DuplicateSilence, create_silence, find_duplicate, lock_matchers

READ = ["incidents.view_incident"]
ACT = ["incidents.change_incident"]


class Conflict(APIException):
    status_code = status.HTTP_409_CONFLICT
    default_code = "conflict"


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

    @extend_schema(request=TransitionSerializer, responses=IncidentSerializer)
    @action(detail=True, methods=["post"])
    def reopen(self, request: Request, pk: str | None = None, **kwargs: Any) -> Response:
        return self._move(request, actions.reopen_incident)

    @extend_schema(request=SeveritySerializer, responses=IncidentSerializer)
    @action(detail=True, methods=["post"])
    def severity(self, request: Request, pk: str | None = None, **kwargs: Any) -> Response:
        serializer = SeveritySerializer(data=request.data)
        serializer.is_valid(raise_exception=True)
        try:
            incident = actions.change_severity(
                self.get_object(), actor=self._actor(request), **serializer.validated_data
            )
        except TransitionError as exc:
            raise Conflict(str(exc)) from None
        except ValueError as exc:
            return Response({"severity": [str(exc)]}, status=status.HTTP_400_BAD_REQUEST)
        return Response(IncidentSerializer(incident).data)

    @extend_schema(request=MergeSerializer, responses=IncidentSerializer)
    @action(detail=True, methods=["post"])
    def merge(self, request: Request, pk: str | None = None, **kwargs: Any) -> Response:
        """Merge this incident into ``into``; answers with the target."""
        serializer = MergeSerializer(data=request.data)
        serializer.is_valid(raise_exception=True)
        try:
            target = actions.merge_incidents(
                self.get_object(), into=serializer.validated_data["into"], actor=self._actor(request)
            )
        except TransitionError as exc:
            raise Conflict(str(exc)) from None
        except ValueError as exc:
            return Response({"into": [str(exc)]}, status=status.HTTP_400_BAD_REQUEST)
        return Response(IncidentSerializer(target).data)

    @extend_schema(
        methods=["GET"],
        responses=SilencePreviewSerializer,
        description="Matchers from the incident's labels, and the findings firing now that they would silence.",
    )
    @extend_schema(methods=["POST"], request=SilenceFromIncidentSerializer, responses={201: SilenceSerializer})
    # Creating a silence is what this POST does: it needs the silence permission, not the
    # incident one (DRF sets the action's extra keywords on the view, where RolePermission reads them).
    @action(
        detail=True,
        methods=["get", "post"],
        required_permissions={"GET": READ, "HEAD": READ, "OPTIONS": READ, "POST": [*READ, "incidents.add_silence"]},
    )
    def silence(self, request: Request, pk: str | None = None, **kwargs: Any) -> Response:
        incident = self.get_object()
        if request.method == "GET":
            matchers = actions.silence_matchers_for(incident)
            preview = actions.silence_preview(matchers) if matchers else []
            return Response(SilencePreviewSerializer({"matchers": matchers, "findings": preview}).data)
        serializer = SilenceFromIncidentSerializer(data=request.data)
        serializer.is_valid(raise_exception=True)
        data = serializer.validated_data
        matchers = data.get("matchers")
        if not matchers:
            matchers = actions.silence_matchers_for(incident)
            if not actions.is_specific(matchers):
                # e.g. a merged incident's shared labels can be just the site: that would mute it all
                names = ", ".join(sorted(actions.SPECIFIC_LABELS))
                return Response(
                    {"matchers": [f"The incident's labels name no {names}; give matchers explicitly."]},
                    status=status.HTTP_400_BAD_REQUEST,
                )
        try:
            silence = actions.silence_incident(
                incident, matchers=matchers, hours=data["hours"], comment=data["comment"], actor=self._actor(request)
            )
        except DuplicateSilence as exc:
            raise Conflict(str(exc)) from None
        return Response(SilenceSerializer(silence).data, status=status.HTTP_201_CREATED)

    @extend_schema(request=None, responses=IncidentSerializer)
    @action(detail=True, methods=["post"], url_path="postmortem-draft")
    def postmortem_draft(self, request: Request, pk: str | None = None, **kwargs: Any) -> Response:
        """Fill the postmortem's empty fields from the timeline (never overwrites)."""
        incident = actions.draft_postmortem(self.get_object(), actor=self._actor(request))
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
        """A silence with the same matchers over an overlapping time is refused with 409."""
        data = serializer.validated_data
        try:
            serializer.instance = create_silence(
                matchers=data["matchers"],
                starts_at=data.get("starts_at") or timezone.now(),
                ends_at=data["ends_at"],
                comment=data["comment"],
                created_by=self.request.user,
            )
        except DuplicateSilence as exc:
            raise Conflict(str(exc)) from None

    def perform_update(self, serializer: SilenceSerializer) -> None:
        silence = serializer.instance
        data = serializer.validated_data
        with transaction.atomic():
            lock_matchers(data.get("matchers", silence.matchers))  # as create_silence: no racing twin
            duplicate = find_duplicate(
                data.get("matchers", silence.matchers),
                data.get("starts_at", silence.starts_at),
                data.get("ends_at", silence.ends_at),
                exclude=silence.pk,
            )
            if duplicate is not None:
                raise Conflict(str(DuplicateSilence(duplicate)))
            serializer.save()


# Maintenance windows are silence-like: the roles that may silence may plan maintenance.
_SILENCE_PERMISSIONS = {
    "GET": ["incidents.view_silence"],
    "HEAD": ["incidents.view_silence"],
    "OPTIONS": ["incidents.view_silence"],
    "POST": ["incidents.add_silence"],
    "PUT": ["incidents.change_silence"],
    "PATCH": ["incidents.change_silence"],
    "DELETE": ["incidents.delete_silence"],
}


class MaintenanceWindowViewSet(viewsets.ModelViewSet):
    """Findings about a node, rack or site in maintenance are recorded but open no incident."""

    queryset = MaintenanceWindow.objects.select_related("created_by")
    serializer_class = MaintenanceWindowSerializer
    required_permissions = _SILENCE_PERMISSIONS

    def perform_create(self, serializer: MaintenanceWindowSerializer) -> None:
        serializer.save(created_by=self.request.user)


class NotificationChannelViewSet(viewsets.ModelViewSet):
    queryset = NotificationChannel.objects.all()
    serializer_class = NotificationChannelSerializer
