"""Who may use which route: every URL of the URL conf and every websocket route, tried by every
persona with every method the route takes, against one table of intended rules (RULES).

A route with no rule fails the test, naming it, so a new route cannot ship before someone decides
who may use it; a rule whose route is gone fails too, and so does a rule that leaves out a method
its view takes. The roles are console/roles.py's (ARCHITECTURE.md, "Roles"); the doors are
console/middleware.py (401 for machines, the login page for people), console/permissions.py (a
model permission for every API method, reads included) and the pages' own checks on POST.

Each test collects every violation before it fails, so one run shows every problem.
"""

from __future__ import annotations

import enum
import logging
import re
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from datetime import timedelta
from functools import cached_property
from typing import Any
from urllib.parse import urlsplit

import pytest
from asgiref.sync import async_to_sync
from channels.testing import WebsocketCommunicator
from django.conf import settings
from django.contrib.auth.models import User
from django.http import HttpResponse
from django.shortcuts import resolve_url
from django.test import Client
from django.urls import URLPattern, URLResolver, get_resolver, resolve
from django.utils import timezone

from compliance.models import (
    AuditEntry,
    CompliancePack,
    DataAsset,
    Dataset,
    GpaiModel,
    LegalHold,
    Lineage,
    ProcessorRecord,
    RecoveryItem,
    RetentionPolicy,
    RetentionRun,
    SubjectRequest,
)
from compliance.services import summary
from console import roles
from console.models import PersonalToken
from fleet.capacity.models import Pool, PowerApproval, ProcurementOrder, Reservation, Team, TeamQuota
from fleet.cost.models import PoolPrice
from fleet.models import Endpoint, Gpu, Job, Node, NodeInterface, NodeMount, Rack, SchedulerQueue, ScrapeTarget, Site
from goodput.asgi import application
from goodput.routing import websocket_urlpatterns
from incidents.models import ActionItem, Incident, MaintenanceWindow, NotificationChannel, Silence
from incidents.services.engine import raise_finding
from tests.conftest import _make_user

# --- personas ----------------------------------------------------------------------------------

ADMIN = "admin"
OPERATOR = "operator"
COMPLIANCE = "compliance-officer"
CAPACITY = "capacity-approver"
VIEWER = "viewer"
NO_ROLE = "no-role"
ANONYMOUS = "anonymous"
AGENT = "agent-token(other site)"
VIEWER_TOKEN = "personal-token(viewer)"
OPERATOR_TOKEN = "personal-token(operator)"

EVERY_ROLE = frozenset({ADMIN, OPERATOR, COMPLIANCE, CAPACITY, VIEWER})
OPERATORS = frozenset({ADMIN, OPERATOR})
ADMINS = frozenset({ADMIN})
# fleet.approve_capacity: approve others' orders and power approvals, change team quotas.
APPROVERS = frozenset({ADMIN, CAPACITY})
OFFICERS = frozenset({ADMIN, COMPLIANCE})  # compliance records: reads too
RECOVERY = OPERATORS | OFFICERS  # the recovery register: SREs, compliance officers, admins (console.roles._RECOVERY)


@dataclass
class Persona:
    name: str
    user: User | None = None
    headers: dict[str, str] = field(default_factory=dict)  # a token's Authorization header
    acts_as: str | None = None  # a personal token: the role persona whose permissions it carries

    @property
    def is_staff(self) -> bool:
        return bool(self.user and self.user.is_staff)

    def new_client(self) -> Client:
        client = Client(raise_request_exception=False)  # a 500 is a finding to report, not a crash
        if self.user is not None:
            client.force_login(self.user)
        return client

    @cached_property
    def client(self) -> Client:
        return self.new_client()


@pytest.fixture
def personas(
    admin_user: User, operator_user: User, viewer_user: User, norole_user: User, token_a: str
) -> list[Persona]:
    """Least privileged first: a write the rule refuses is tried before one that may delete the object."""
    return [
        Persona(ANONYMOUS),
        # The objects live at site B (see `targets`); the token is site A's.
        Persona(AGENT, headers={"HTTP_AUTHORIZATION": f"Bearer {token_a}"}),
        Persona(NO_ROLE, norole_user),
        # A person's API token, with that person's role: no user here, so no session.
        Persona(VIEWER_TOKEN, headers=_bearer(PersonalToken.issue(user=viewer_user, name="matrix")[1]), acts_as=VIEWER),
        Persona(VIEWER, viewer_user),
        Persona(COMPLIANCE, _make_user("cora", roles.COMPLIANCE_OFFICER)),
        Persona(CAPACITY, _make_user("cappy", roles.CAPACITY_APPROVER)),
        Persona(
            OPERATOR_TOKEN, headers=_bearer(PersonalToken.issue(user=operator_user, name="matrix")[1]), acts_as=OPERATOR
        ),
        Persona(OPERATOR, operator_user),
        Persona(ADMIN, admin_user),
    ]


def _bearer(token: str) -> dict[str, str]:
    return {"HTTP_AUTHORIZATION": f"Bearer {token}"}


# --- the routes, from the resolver -------------------------------------------------------------

# Views whose methods the test reads from the class; third-party views (auth, admin, the schema,
# DRF's API root) take the methods their rule names.
PROJECT_APPS = {"console", "fleet", "incidents", "compliance"}
# HEAD and OPTIONS follow GET; a route that takes PUT takes PATCH too, which is the one tried.
TRIED_METHODS = ("GET", "POST", "PATCH", "DELETE")


@dataclass(frozen=True)
class Route:
    namespace: str  # "api:fleet-api"; "" outside any namespace
    name: str | None
    route: str  # as ResolverMatch.route spells it
    methods: frozenset[str] | None  # what the view takes, where the class tells

    @property
    def key(self) -> str:
        label = self.name or self.route
        return f"{self.namespace}:{label}" if self.namespace else label

    @property
    def is_format_suffix(self) -> bool:
        return "format>" in self.route


def _join(prefix: str, part: str) -> str:
    # As django.urls.URLResolver._join_route does, so routes compare equal to ResolverMatch.route.
    return prefix + part.removeprefix("^") if prefix else part


def view_methods(callback: Any) -> frozenset[str] | None:
    view_class = getattr(callback, "cls", None) or getattr(callback, "view_class", None)
    if view_class is None or view_class.__module__.split(".")[0] not in PROJECT_APPS:
        return None
    actions = getattr(callback, "actions", None)  # a DRF viewset binds only its router's actions
    names = set(actions) if actions else {m for m in view_class.http_method_names if hasattr(view_class, m)}
    methods = {m.upper() for m in names & set(view_class.http_method_names)}
    if "PUT" in methods:
        methods = (methods - {"PUT"}) | {"PATCH"}
    return frozenset(methods & set(TRIED_METHODS))


def _walk(patterns: list[Any], prefix: str = "", namespace: str = "") -> Iterator[Route]:
    for pattern in patterns:
        route = _join(prefix, str(pattern.pattern))
        if isinstance(pattern, URLResolver):
            yield from _walk(pattern.url_patterns, route, ":".join(filter(None, [namespace, pattern.namespace])))
        elif isinstance(pattern, URLPattern):
            yield Route(namespace, pattern.name, route, view_methods(pattern.callback))


def http_routes() -> list[Route]:
    return list(_walk(get_resolver().url_patterns))


def websocket_routes() -> list[Route]:
    return [Route("ws", None, str(p.pattern), None) for p in websocket_urlpatterns]


# URL parameters: a rule's target object fills pk, uuid and hostname; the rest take these.
DEFAULT_VALUES = {
    "pk": "1",
    "id": "1",
    "uuid": "GPU-00000000-0000-0000-0000-000000000000",
    "hostname": "gpu-x-001",
    "object_id": "1",
    "content_type_id": "1",
    "app_label": "fleet",
    "url": "no-such-page",
    "format": "json",  # DRF's format-suffix variants: same rule as their base route
    "version": "1",  # a published summary version (the summary_model target has one)
    "fmt": "md",  # a summary export
    "page": "fleet",  # a page of the manual
}
_REGEX_GROUP = re.compile(r"\(\?P<(?P<name>\w+)>[^)]*\)")
_ROUTE_PARAMETER = re.compile(r"<(?:(?P<converter>\w+):)?(?P<name>\w+)>")


def concrete_path(route: str, values: Mapping[str, str]) -> str:
    """'api/v1/fleet/gpus/(?P<uuid>[A-Za-z0-9-]+)/$' -> '/api/v1/fleet/gpus/GPU-.../'."""
    path = _REGEX_GROUP.sub(lambda m: values[m["name"]], route)  # before <name>: (?P<pk>...) holds one
    path = _ROUTE_PARAMETER.sub(
        lambda m: ("." if m["converter"] == "drf_format_suffix" else "") + values[m["name"]], path
    )
    path = path.removeprefix("^").removesuffix("$").replace("/?", "/").replace("\\.", ".")
    return "/" + path


# --- the rules -----------------------------------------------------------------------------------


class Kind(enum.Enum):
    OPEN = "open to everyone"
    SIGN_OUT = "ends whatever session it is sent"
    PAGE = "a page: a session with a role"
    API = "REST API: a session with the model permission"
    AGENT_ONLY = "an agent token only, never a session"
    # Training jobs and events: people by role; an agent token POSTs for its own site's jobs only
    # (the persona's token is site A's and the objects are site B's: refused, but a POST to a
    # list, which registers a job at the token's own site, is let through).
    API_AND_AGENT = "REST API for people; an agent token writes its own site's"
    METRICS = "a session with a role, or an agent token"
    STAFF = "staff only"
    ADMIN_LOGIN = "the admin's login form, for signed-in users only"
    WEBSOCKET = "a session with a role"


PEOPLE_KINDS = {Kind.PAGE, Kind.SIGN_OUT, Kind.STAFF, Kind.ADMIN_LOGIN}  # refused as: the login page


@dataclass(frozen=True)
class Rule:
    kind: Kind
    methods: Mapping[str, frozenset[str]]  # method -> the role personas the rule lets through
    target: str | None = None  # the object (see `targets`) whose pk, uuid or hostname fills the URL


def open_route() -> Rule:
    return Rule(Kind.OPEN, {"GET": EVERY_ROLE})


def page(
    *, read: frozenset[str] | None = EVERY_ROLE, post: frozenset[str] | None = None, target: str | None = None
) -> Rule:
    methods = {m: r for m, r in (("GET", read), ("POST", post)) if r is not None}
    return Rule(Kind.PAGE, methods, target)


def api(
    *,
    read: frozenset[str] | None = EVERY_ROLE,
    post: frozenset[str] | None = None,
    patch: frozenset[str] | None = None,
    delete: frozenset[str] | None = None,
    target: str | None = None,
) -> Rule:
    pairs = (("GET", read), ("POST", post), ("PATCH", patch), ("DELETE", delete))
    return Rule(Kind.API, {m: r for m, r in pairs if r is not None}, target)


def incident_action(method: str = "POST") -> Rule:
    return Rule(Kind.API, {method: OPERATORS}, "incident")


AGENT_ONLY = Rule(Kind.AGENT_ONLY, {"POST": frozenset()})

RULES: dict[str, Rule] = {
    # open: probes and the login page
    "healthz": open_route(),
    "readyz": open_route(),
    "login": open_route(),
    "logout": Rule(Kind.SIGN_OUT, {"POST": EVERY_ROLE}),
    # pages: any role reads; the pages that take a POST check the Operator's permissions
    "home": page(),
    "fleet:dashboard": page(),
    "fleet:targets": page(post=OPERATORS),  # fleet.add_scrapetarget
    "fleet:gpu_detail": page(target="gpu"),
    "fleet:node_detail": page(target="node"),
    "training:dashboard": page(),
    "training:job_detail": page(target="job"),
    "serving:dashboard": page(),
    "power:dashboard": page(),
    "fabric:dashboard": page(),
    "storage:dashboard": page(),
    "cost:dashboard": page(),
    # map queues (fleet.change_schedulerqueue) or import the scheduler's quota (the quota rule)
    "scheduler:queues": page(post=OPERATORS | APPROVERS),
    "capacity:plan": page(post=APPROVERS),  # approve or reject orders and power approvals
    # request (fleet.add_reservation), approve and cancel (fleet.change_reservation)
    "capacity:reservations": page(post=OPERATORS),
    "capacity:team": page(target="team"),  # a team's members, quotas, reservations and queue waits: reads only
    "serving:endpoint_detail": page(post=OPERATORS, target="endpoint"),  # the SLO form: fleet.change_endpoint
    "incidents:list": page(),
    "incidents:metrics": page(),
    "incidents:silences": page(post=OPERATORS),  # incidents.add_silence
    "incidents:maintenance": page(post=OPERATORS),  # incidents.add_silence
    "incidents:detail": page(target="incident"),
    "incidents:act": page(read=None, post=OPERATORS, target="incident"),
    # a person's own API tokens: any role makes and revokes its own (someone else's is a 404)
    "personal_tokens": page(post=EVERY_ROLE),
    "personal_token_revoke": page(read=None, post=EVERY_ROLE, target="personal_token"),
    # people and their roles: the Admin's alone (create, role, deactivate, reactivate)
    "people": page(read=ADMINS, post=ADMINS),
    # the console's own metrics
    "metrics": Rule(Kind.METRICS, {"GET": EVERY_ROLE}),
    # REST API, fleet: sites, racks and nodes are the Admin's inventory; operators change nodes and
    # GPUs and own the scrape targets; endpoints are registered by the metrics they report.
    "api:fleet-api:api-root": api(),
    "api:fleet-api:overview": api(),
    "api:fleet-api:gpu-table": api(),
    "api:fleet-api:site-list": api(post=ADMINS),
    "api:fleet-api:site-detail": api(patch=ADMINS, delete=ADMINS, target="site"),
    "api:fleet-api:rack-list": api(post=ADMINS),
    "api:fleet-api:rack-detail": api(patch=ADMINS, delete=ADMINS, target="rack"),
    "api:fleet-api:node-list": api(post=ADMINS),
    "api:fleet-api:node-detail": api(patch=OPERATORS, delete=ADMINS, target="node"),
    "api:fleet-api:node-series": api(target="node"),  # the node page's snapshot
    "api:fleet-api:gpu-list": api(),  # GPUs are registered by ingest
    "api:fleet-api:gpu-detail": api(patch=OPERATORS, delete=ADMINS, target="gpu"),
    "api:fleet-api:gpu-series": api(target="gpu"),  # the GPU page's snapshot
    "api:fleet-api:endpoint-list": api(),
    "api:fleet-api:endpoint-detail": api(patch=OPERATORS, target="endpoint"),
    # an endpoint's change events and evals: written by Operators or an agent token of its site
    "api:serving-api:endpoint-changes": Rule(Kind.API_AND_AGENT, {"GET": EVERY_ROLE, "POST": OPERATORS}, "endpoint"),
    "api:serving-api:endpoint-evals": Rule(Kind.API_AND_AGENT, {"GET": EVERY_ROLE, "POST": OPERATORS}, "endpoint"),
    "api:serving-api:endpoint-slo": Rule(Kind.API, {"GET": EVERY_ROLE}, "endpoint"),
    # the serving pages' snapshots: reads for any role
    "api:serving-api:overview": api(),
    "api:serving-api:endpoint-snapshot": api(target="endpoint"),
    # the power page's snapshot: reads for any role
    "api:power-api:snapshot": api(),
    # the fabric and storage pages' snapshots: reads for any role
    "api:fabric-api:snapshot": api(),
    "api:storage-api:snapshot": api(),
    # the cost page's figures and CSV: reads for any role; prices are set by Admins and capacity
    # approvers (fleet.add_poolprice, fleet.change_poolprice)
    "api:cost-api:snapshot": api(),
    "api:cost-api:training": api(),
    "api:cost-api:idle": api(),
    "api:cost-api:reserved": api(),
    "api:cost-api:incidents": api(),
    "api:cost-api:serving": api(),
    "api:cost-api:own-or-rent": api(),
    "api:cost-api:export": api(),
    "api:cost-api:poolprice-list": api(post=APPROVERS),
    "api:cost-api:poolprice-detail": api(patch=APPROVERS, target="pool_price"),
    "api:fleet-api:scrapetarget-list": api(post=OPERATORS),
    "api:fleet-api:scrapetarget-detail": api(patch=OPERATORS, delete=OPERATORS, target="scrape_target"),
    # a node's ports and mounts: found by ingest (no POST, no DELETE); operators set the fabric,
    # kind and purpose
    # scheduler queues: found by ingest; operators map them to a pool and team. Importing the
    # scheduler's quota into TeamQuota follows the quota rule (fleet.capacity.actions.approvals).
    "api:scheduler-api:api-root": api(),
    "api:scheduler-api:schedulerqueue-list": api(),
    "api:scheduler-api:schedulerqueue-detail": api(patch=OPERATORS, target="scheduler_queue"),
    "api:scheduler-api:quota-drift": api(),
    "api:scheduler-api:quota-drift-import": api(read=None, post=APPROVERS),
    "api:fleet-api:interface-list": api(),
    "api:fleet-api:interface-detail": api(patch=OPERATORS, target="interface"),
    "api:fleet-api:mount-list": api(),
    "api:fleet-api:mount-detail": api(patch=OPERATORS, target="mount"),
    # the machine doors
    "api:ingest-gpu-samples": AGENT_ONLY,
    "api:ingest-prometheus": AGENT_ONLY,
    "api:ingest-prometheus-remote-write": AGENT_ONLY,
    "api:alertmanager": AGENT_ONLY,
    # the recovery register: backup jobs report runs with an agent token of the item's site; operators,
    # compliance officers and admins read it, keep it (the pages' forms) and record restore tests, which
    # an agent token of the item's site may also record (the list POST, an empty body: 400, is let through)
    "api:recovery-api:backup-report": AGENT_ONLY,
    "api:recovery-api:item-list": api(read=RECOVERY),
    "api:recovery-api:restore-test": Rule(Kind.API_AND_AGENT, {"POST": RECOVERY}),
    "recovery:register": page(read=RECOVERY, post=RECOVERY),
    "recovery:item": page(read=RECOVERY, post=RECOVERY, target="recovery_item"),
    # REST API, incidents: operators move incidents along and own silences and action items
    "api:incidents-api:api-root": api(),
    "api:incidents-api:incident-list": api(),
    "api:incidents-api:incident-detail": api(target="incident"),
    "api:incidents-api:incident-acknowledge": incident_action(),
    "api:incidents-api:incident-mitigate": incident_action(),
    "api:incidents-api:incident-resolve": incident_action(),
    "api:incidents-api:incident-notes": incident_action(),
    "api:incidents-api:incident-roles": incident_action(),
    "api:incidents-api:incident-postmortem": incident_action("PATCH"),
    "api:incidents-api:incident-reopen": incident_action(),
    "api:incidents-api:incident-severity": incident_action(),
    "api:incidents-api:incident-merge": incident_action(),
    "api:incidents-api:incident-postmortem-draft": incident_action(),
    # GET: the matchers from the incident's labels and what they would silence now (a read)
    "api:incidents-api:incident-silence": Rule(Kind.API, {"GET": EVERY_ROLE, "POST": OPERATORS}, "incident"),
    "api:incidents-api:timelineentry-list": api(),  # append-only: notes go through incident-notes
    "api:incidents-api:timelineentry-detail": api(target="timeline_entry"),
    "api:incidents-api:actionitem-list": api(post=OPERATORS),
    "api:incidents-api:actionitem-detail": api(patch=OPERATORS, target="action_item"),
    "api:incidents-api:silence-list": api(post=OPERATORS),
    "api:incidents-api:silence-detail": api(patch=OPERATORS, delete=OPERATORS, target="silence"),
    "api:incidents-api:maintenancewindow-list": api(post=OPERATORS),
    "api:incidents-api:maintenancewindow-detail": api(patch=OPERATORS, delete=OPERATORS, target="maintenance_window"),
    # Channels hold webhook URLs and PagerDuty routing keys: settings, the Admin's alone (no other
    # role holds incidents.view_notificationchannel).
    "api:incidents-api:notificationchannel-list": api(read=ADMINS, post=ADMINS),
    "api:incidents-api:notificationchannel-detail": api(
        read=ADMINS, patch=ADMINS, delete=ADMINS, target="notification_channel"
    ),
    # REST API, training: jobs and their events are written by training clients (an agent token of
    # the job's site) and by operators; any role reads them.
    "api:training-api:api-root": api(),
    "api:training-api:job-list": Rule(Kind.API_AND_AGENT, {"GET": EVERY_ROLE, "POST": OPERATORS}),
    "api:training-api:job-detail": api(patch=OPERATORS, delete=ADMINS, target="job"),
    "api:training-api:job-events": Rule(Kind.API_AND_AGENT, {"POST": OPERATORS}, "job"),
    # the training pages' snapshots: reads for any role
    "api:training-api:overview": api(),
    "api:training-api:job-snapshot": api(target="job"),
    # REST API, capacity: any role reads pools, supply, quotas, reservations and the plan; operators
    # write them and approve or cancel reservations (not their own: fleet.capacity.actions.approvals). Orders
    # and power approvals are requested by operators and approved by an Admin or a Capacity approver,
    # who alone change team quotas. An agent token (a scheduler hook) may only request a reservation
    # on its own site's pools: the list POST (an empty body: 400) is let through.
    "api:capacity-api:api-root": api(),
    "api:capacity-api:plan": api(),
    "api:capacity-api:plan-csv": api(),
    "api:capacity-api:reservations-csv": api(),
    "api:capacity-api:pool-list": api(post=OPERATORS),
    "api:capacity-api:pool-detail": api(patch=OPERATORS, target="pool"),
    "api:capacity-api:procurementorder-list": api(post=OPERATORS),
    "api:capacity-api:procurementorder-detail": api(patch=OPERATORS | APPROVERS, target="procurement_order"),
    "api:capacity-api:procurementorder-approve": Rule(Kind.API, {"POST": APPROVERS}, "procurement_order"),
    "api:capacity-api:procurementorder-reject": Rule(Kind.API, {"POST": APPROVERS}, "procurement_order"),
    "api:capacity-api:powerapproval-list": api(post=OPERATORS),
    "api:capacity-api:powerapproval-detail": api(patch=OPERATORS | APPROVERS, target="power_approval"),
    "api:capacity-api:powerapproval-approve": Rule(Kind.API, {"POST": APPROVERS}, "power_approval"),
    "api:capacity-api:powerapproval-reject": Rule(Kind.API, {"POST": APPROVERS}, "power_approval"),
    "api:capacity-api:teamquota-list": api(post=APPROVERS),
    "api:capacity-api:teamquota-detail": api(patch=APPROVERS, target="team_quota"),
    "api:capacity-api:reservation-list": Rule(Kind.API_AND_AGENT, {"GET": EVERY_ROLE, "POST": OPERATORS}),
    # Changed only by its requester or an Admin, in any state (issue 37): nobody here requested it.
    "api:capacity-api:reservation-detail": api(patch=ADMINS, target="reservation"),
    "api:capacity-api:reservation-approve": Rule(Kind.API, {"POST": OPERATORS}, "reservation"),
    "api:capacity-api:reservation-cancel": Rule(Kind.API, {"POST": OPERATORS}, "reservation"),
    # the schema and its docs need a role, like the API they describe
    "schema": api(),
    "api-docs": api(),
    # the manual (docs/), read by every role
    "docs:index": page(),
    "docs:page": page(),
    # the admin
    "admin:login": Rule(Kind.ADMIN_LOGIN, {"GET": ADMINS}),
    "admin:*": Rule(Kind.STAFF, {"GET": ADMINS}),
    # compliance: officers and admins only, for reads too (each area adds its routes below)
    "compliance:home": page(read=OFFICERS),
    # the compliance pack: request (POST), follow, download (a pack not built yet is a 409)
    "compliance:pack-list": page(read=OFFICERS, post=OFFICERS),
    "api:compliance-api:pack-list": api(read=OFFICERS, post=OFFICERS),
    "api:compliance-api:pack-detail": api(read=OFFICERS, target="compliance_pack"),
    "api:compliance-api:pack-download": api(read=OFFICERS, target="compliance_pack"),
    # audit: the log page, its CSV export and the read-only API (no write method at all)
    "compliance:audit-list": page(read=OFFICERS),
    "compliance:audit-export": page(read=OFFICERS),
    "api:compliance-api:audit-list": api(read=OFFICERS),
    "api:compliance-api:audit-detail": api(read=OFFICERS, target="audit_entry"),
    # gdpr: records of processing and data-subject requests (never deleted)
    "compliance:processing": page(read=OFFICERS, post=OFFICERS),
    "api:compliance-api:data-asset-list": api(read=OFFICERS, post=OFFICERS),
    "api:compliance-api:data-asset-detail": api(read=OFFICERS, patch=OFFICERS, delete=OFFICERS, target="data_asset"),
    "api:compliance-api:processor-record-list": api(read=OFFICERS, post=OFFICERS),
    "api:compliance-api:processor-record-detail": api(
        read=OFFICERS, patch=OFFICERS, delete=OFFICERS, target="processor_record"
    ),
    "api:compliance-api:subject-request-list": api(read=OFFICERS, post=OFFICERS),
    "api:compliance-api:subject-request-detail": api(read=OFFICERS, patch=OFFICERS, target="subject_request"),
    # retention: policies, legal holds (placed and released), runs (read-only), preview and run now
    "compliance:retention": page(read=OFFICERS, post=OFFICERS),
    "api:compliance-api:retention-policy-list": api(read=OFFICERS, post=OFFICERS),
    "api:compliance-api:retention-policy-detail": api(
        read=OFFICERS, patch=OFFICERS, delete=OFFICERS, target="retention_policy"
    ),
    "api:compliance-api:legal-hold-list": api(read=OFFICERS, post=OFFICERS),
    "api:compliance-api:legal-hold-detail": api(read=OFFICERS, target="legal_hold"),
    "api:compliance-api:legal-hold-release": api(read=None, post=OFFICERS, target="legal_hold"),
    "api:compliance-api:retention-run-list": api(read=OFFICERS),
    "api:compliance-api:retention-run-detail": api(read=OFFICERS, target="retention_run"),
    "api:compliance-api:retention-preview": api(read=None, post=OFFICERS),
    "api:compliance-api:retention-run-now": api(read=None, post=OFFICERS),
    # the register: models, datasets (with the crawler CSV) and lineage
    "compliance:model-list": page(read=OFFICERS, post=OFFICERS),
    "compliance:model-detail": page(read=OFFICERS, post=OFFICERS, target="register_model"),
    "compliance:dataset-list": page(read=OFFICERS, post=OFFICERS),
    "compliance:dataset-detail": page(read=OFFICERS, post=OFFICERS, target="register_dataset"),
    "api:compliance-api:model-list": api(read=OFFICERS, post=OFFICERS),
    "api:compliance-api:model-detail": api(read=OFFICERS, patch=OFFICERS, delete=OFFICERS, target="register_model"),
    "api:compliance-api:dataset-list": api(read=OFFICERS, post=OFFICERS),
    "api:compliance-api:dataset-detail": api(read=OFFICERS, patch=OFFICERS, delete=OFFICERS, target="register_dataset"),
    "api:compliance-api:dataset-domains": api(read=OFFICERS, post=OFFICERS, target="register_dataset"),
    "api:compliance-api:lineage-list": api(read=OFFICERS, post=OFFICERS),
    "api:compliance-api:lineage-detail": api(read=OFFICERS, delete=OFFICERS, target="register_lineage"),
    # the training-content summary: the page publishes (POST); published versions are read-only
    "compliance:summary": page(read=OFFICERS, post=OFFICERS, target="summary_model"),
    "compliance:summary-version": page(read=OFFICERS, target="summary_model"),
    "api:compliance-api:summary-draft": api(read=OFFICERS, target="summary_model"),
    "api:compliance-api:summary-publish": api(read=None, post=OFFICERS, target="summary_model"),
    "api:compliance-api:summary-version-list": api(read=OFFICERS, target="summary_model"),
    "api:compliance-api:summary-version-detail": api(read=OFFICERS, target="summary_model"),
    "api:compliance-api:summary-version-export": api(read=OFFICERS, target="summary_model"),
    "api:compliance-api:summary-version-diff": api(read=OFFICERS, target="summary_model"),
    # websockets
    "ws:ws/live/": Rule(Kind.WEBSOCKET, {"CONNECT": EVERY_ROLE}),
}


def rule_for(route: Route) -> Rule | None:
    """The route's own rule, else that of its namespace or an enclosing one ("admin:*")."""
    if route.key in RULES:
        return RULES[route.key]
    parts = route.namespace.split(":") if route.namespace else []
    for depth in range(len(parts), 0, -1):
        if (rule := RULES.get(":".join(parts[:depth]) + ":*")) is not None:
            return rule
    return None


# --- what a rule says a persona gets -----------------------------------------------------------


def _location(response: HttpResponse) -> str:
    return urlsplit(response.get("Location", "")).path


def _to_login(response: HttpResponse) -> bool:
    return response.status_code == 302 and _location(response) == resolve_url(settings.LOGIN_URL)


def _to_any_login(response: HttpResponse) -> bool:
    return response.status_code == 302 and _location(response) in {resolve_url(settings.LOGIN_URL), "/admin/login/"}


@dataclass(frozen=True)
class Expect:
    says: str
    holds: Callable[[HttpResponse], bool]


OK = Expect("200", lambda r: r.status_code == 200)
ANSWERED = Expect("an answer (2xx or 3xx)", lambda r: 200 <= r.status_code < 400)
UNAUTHORIZED = Expect("401", lambda r: r.status_code == 401)
FORBIDDEN = Expect("403", lambda r: r.status_code == 403)
REFUSED = Expect("401 or 403", lambda r: r.status_code in (401, 403))
TO_LOGIN = Expect("a redirect to the login page", _to_login)
NOT_A_PERSON = Expect("a redirect to the login page, 401 or 403", lambda r: _to_login(r) or r.status_code in (401, 403))
PERMITTED = Expect(
    "let through (2xx, 3xx or a 4xx other than 401/403)",
    lambda r: r.status_code < 500 and r.status_code not in (401, 403) and not _to_any_login(r),
)
SIGNED_OUT = Expect("a redirect to the login page", _to_login)
# Past the staff check: the admin's own model permissions may still answer 403 (a read-only model's
# add page, a model of an app outside roles.ADMIN_APPS).
STAFF_PASSED = Expect(
    "past the staff check (no 401, no redirect to a login page, no 5xx)",
    lambda r: r.status_code < 500 and r.status_code != 401 and not _to_any_login(r),
)
STAFF_REFUSED = Expect(
    "a redirect to a login page or to the admin index, or 403",
    lambda r: r.status_code == 403 or _to_any_login(r) or (r.status_code == 302 and _location(r) == "/admin/"),
)


def expected(rule: Rule, persona: Persona, method: str) -> Expect:
    allowed = rule.methods[method]
    if rule.kind is Kind.OPEN:
        return ANSWERED  # the login page sends a signed-in user on to the home page
    if rule.kind is Kind.SIGN_OUT:
        return SIGNED_OUT
    if persona.name == ANONYMOUS:
        return TO_LOGIN if rule.kind in PEOPLE_KINDS else UNAUTHORIZED
    if persona.name == AGENT:
        if rule.kind is Kind.AGENT_ONLY:
            return PERMITTED
        if rule.kind is Kind.API_AND_AGENT:
            return PERMITTED if method == "POST" and rule.target is None else REFUSED
        if rule.kind is Kind.METRICS:
            return OK
        return NOT_A_PERSON if rule.kind in PEOPLE_KINDS else REFUSED
    if persona.acts_as is not None:
        # A personal token: the API with its user's role; never a page, an agent door or /metrics.
        if rule.kind in (Kind.API, Kind.API_AND_AGENT):
            return (OK if method == "GET" else PERMITTED) if persona.acts_as in allowed else FORBIDDEN
        return TO_LOGIN if rule.kind in PEOPLE_KINDS else REFUSED
    # A signed-in person from here on.
    if rule.kind is Kind.AGENT_ONLY:
        # Intended 403; DRF answers 401 (with WWW-Authenticate: Bearer) when the only authenticator
        # of the view is the token one, which is as closed. Either refuses; neither lets it in.
        return REFUSED
    if rule.kind is Kind.STAFF:
        return STAFF_PASSED if persona.is_staff else STAFF_REFUSED
    if rule.kind is Kind.ADMIN_LOGIN:
        # Staff go on to the index; other people see the admin's form asking for a staff account.
        return ANSWERED
    if persona.name in allowed:
        return OK if method == "GET" else PERMITTED
    return FORBIDDEN


# --- the checks ------------------------------------------------------------------------------------

PAGE_FORM = {"action": "note", "text": "authorization matrix"}  # a page POST: a harmless incident action


def _describe(response: HttpResponse) -> str:
    location = response.get("Location")
    return f"{response.status_code} -> {location}" if location else str(response.status_code)


def _send(client: Client, persona: Persona, rule: Rule, method: str, path: str) -> HttpResponse:
    if method == "GET":
        return client.get(path, **persona.headers)
    if rule.kind in PEOPLE_KINDS:
        return client.post(path, PAGE_FORM, **persona.headers)
    return client.generic(method, path, "{}", content_type="application/json", **persona.headers)


@dataclass
class Matrix:
    checks: int = 0
    violations: list[str] = field(default_factory=list)

    def record(self, method: str, path: str, persona: str, *, got: str, says: str, held: bool) -> None:
        self.checks += 1
        if not held:
            self.violations.append(f"{method} {path} {persona}: got {got}, rule says {says}")

    def report(self) -> str:
        return f"{len(self.violations)} violations in {self.checks} checks:\n" + "\n".join(self.violations)


@pytest.fixture
def targets(site_a: Site, site_b: Site, admin_user: User) -> dict[str, Any]:
    """One of each object a detail route needs, at site B (the agent persona's token is site A's)."""
    rack = Rack.objects.create(site=site_b, name="row-1")
    node = Node.objects.create(site=site_b, rack=rack, hostname="gpu-b-001")
    gpu = Gpu.objects.create(node=node, index=0, uuid="GPU-bbbbbbbb-0000-0000-0000-000000000001", model="H100")
    labels = {"site": site_b.name, "hostname": node.hostname, "gpu": gpu.uuid}
    raise_finding("matrix:xid", labels, "SEV3", "XID 79 on gpu-b-001", source="test")
    incident = Incident.objects.get()
    pool = Pool.objects.create(site=site_b, gpu_model="H100", name="h100")
    soon = timezone.now() + timedelta(days=1)
    research = Team.objects.create(name="research")
    return {
        "pool": pool,
        "pool_price": PoolPrice.objects.create(pool=pool, valid_from=soon.date(), mode="rate", rate_per_gpu_hour=2),
        "procurement_order": ProcurementOrder.objects.create(
            pool=pool, count=8, ordered_on=soon.date(), promised_on=soon.date()
        ),
        "power_approval": PowerApproval.objects.create(site=site_b, added_kw=100, expected_on=soon.date()),
        "team": research,
        "team_quota": TeamQuota.objects.create(pool=pool, team=research, nominal_gpus=8),
        "reservation": Reservation.objects.create(
            pool=pool, team=research, gpus=1, start=soon, end=soon + timedelta(hours=1)
        ),
        "site": site_b,
        "rack": rack,
        "node": node,
        "gpu": gpu,
        "interface": NodeInterface.objects.create(node=node, name="mlx5_0/1", kind="ib"),
        "scheduler_queue": SchedulerQueue.objects.create(site=site_b, scheduler="kueue", name="team-b-h100"),
        "mount": NodeMount.objects.create(node=node, mountpoint="/mnt/datasets", fstype="xfs", device="/dev/nvme1n1"),
        "endpoint": Endpoint.objects.create(site=site_b, name="llama-3-70b"),
        "scrape_target": ScrapeTarget.objects.create(site=site_b, name="dcgm-b", url="http://127.0.0.1:9/metrics"),
        "incident": incident,
        "timeline_entry": incident.timeline.get(),
        "action_item": ActionItem.objects.create(incident=incident, title="RMA the GPU"),
        "silence": Silence.objects.create(
            matchers=[{"name": "hostname", "op": "=", "value": "gpu-b-002"}],
            ends_at=timezone.now() + timedelta(hours=1),
            comment="maintenance",
        ),
        "maintenance_window": MaintenanceWindow.objects.create(
            scope="node", value="gpu-b-002", ends_at=timezone.now() + timedelta(hours=1), comment="firmware"
        ),
        # The Admin's: revoking it (the Admin) or not finding it (everyone else) leaves the personas' own.
        "personal_token": PersonalToken.issue(user=admin_user, name="matrix target")[0],
        "job": Job.objects.create(site=site_b, name="llama", team="research", gang_size=8, scheduler_id="matrix"),
        "notification_channel": NotificationChannel.objects.create(
            name="hook", kind="webhook", url="http://127.0.0.1:9/hook", enabled=False
        ),
        # a model with its summary's version 1 published
        "summary_model": summary.publish(GpaiModel.objects.create(name="matrix", version="1"), user=admin_user).model,
        # a register model version trained on a crawled dataset
        "register_lineage": (
            lineage := Lineage.objects.create(
                model=GpaiModel.objects.create(name="matrix", version="2"),
                dataset=Dataset.objects.create(name="matrix", source_category="crawled", modality="text"),
            )
        ),
        "register_model": lineage.model,
        "register_dataset": lineage.dataset,
        # gdpr and retention
        "data_asset": DataAsset.objects.create(name="matrix", data_class="audit", lawful_basis="legal_obligation"),
        "subject_request": SubjectRequest.objects.create(kind="access", subject_reference="m", received_on=soon.date()),
        "processor_record": ProcessorRecord.objects.create(
            name="matrix", processor="p", controllers="c", processing_categories="training"
        ),
        "retention_policy": RetentionPolicy.objects.create(data_class="incidents", days=730),
        "legal_hold": LegalHold.objects.create(name="matrix", data_class="audit", reason="matrix"),
        "retention_run": RetentionRun.objects.create(
            data_class="audit", cutoff=soon, started_at=soon, finished_at=soon
        ),
        # the creations above were audited: the latest entry will do
        "audit_entry": AuditEntry.objects.latest("pk"),
        "recovery_item": RecoveryItem.objects.create(
            kind="dataset", name="matrix", method="replication", source_site=site_b
        ),
        # a built pack, its zip stored (its download answers 200)
        "compliance_pack": CompliancePack.objects.create(
            period_start=soon.date(), period_end=soon.date(), status="done", progress=100, size=2
        )
        .chunks.create(seq=0, data=b"PK")
        .pack,
    }


def resolves_to_itself(route: Route, path: str) -> bool:
    """False for a format-suffix variant its base route shadows: a node's hostname may hold a dot,
    so /nodes/gpu-b-001.json/ is the node "gpu-b-001.json", and the variant cannot be reached."""
    return resolve(path).route == route.route


def _key(path: str) -> str:
    match = resolve(path)
    label = match.url_name or match.route
    return f"{match.namespace}:{label}" if match.namespace else label


def _values(rule: Rule, objects: Mapping[str, Any]) -> dict[str, str]:
    values = dict(DEFAULT_VALUES)
    if rule.target is not None:
        obj = objects[rule.target]
        values.update({k: str(getattr(obj, k)) for k in ("pk", "uuid", "hostname") if hasattr(obj, k)})
    return values


# --- the tests -------------------------------------------------------------------------------------


def test_every_route_has_a_rule_and_every_rule_a_route() -> None:
    routes = http_routes() + websocket_routes()
    assert len(routes) > 100  # admin, API routers, pages: a walk that found little would prove nothing
    problems = []
    for route in routes:
        rule = rule_for(route)
        if rule is None:
            problems.append(f"new route {route.key} ({route.route}) has no authorization rule: add one to the matrix")
            continue
        if route.methods is not None and route.methods != set(rule.methods):
            problems.append(
                f"route {route.key} takes {sorted(route.methods)} but its rule covers {sorted(rule.methods)}: "
                "decide who may use the others"
            )
        if route.namespace == "ws":
            continue
        try:
            path = concrete_path(route.route, DEFAULT_VALUES)
        except KeyError as exc:
            problems.append(f"route {route.key} has a URL parameter {exc} the matrix cannot fill: add a value")
            continue
        if not resolves_to_itself(route, path) and not (route.is_format_suffix and _key(path) == route.key):
            problems.append(f"route {route.key}: {path} resolves to {resolve(path).route}, not to {route.route}")
    keys = {route.key for route in routes}
    for key in RULES:
        if key.endswith(":*"):
            if not any(k.startswith(key[:-1]) for k in keys):
                problems.append(f"rule {key} matches no route any more: remove it")
        elif key not in keys:
            problems.append(f"rule {key} names a route that no longer exists: remove it")
    assert not problems, "\n".join(problems)


def test_every_route_holds_to_its_rule_for_every_persona(
    personas: list[Persona], targets: dict[str, Any], caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.ERROR, logger="django.request")  # a thousand 401/403 warnings would bury the report
    routes = [(route, rule) for route in http_routes() if (rule := rule_for(route)) is not None]
    matrix = Matrix()
    # Reads first, deletes last: a delete that the rule allows must not turn a later read into a 404.
    for method in TRIED_METHODS:
        for route, rule in routes:
            if method not in rule.methods:
                continue
            path = concrete_path(route.route, _values(rule, targets))
            if not resolves_to_itself(route, path):
                continue  # a shadowed format-suffix variant: its base route is the one that answers
            for persona in personas:
                # Signing out ends the session: each persona signs out from a session of its own.
                client = persona.new_client() if rule.kind is Kind.SIGN_OUT else persona.client
                response = _send(client, persona, rule, method, path)
                expect = expected(rule, persona, method)
                matrix.record(
                    method, path, persona.name, got=_describe(response), says=expect.says, held=expect.holds(response)
                )
    print(f"\nHTTP authorization matrix: {matrix.checks} checks")
    assert matrix.checks > 1000
    assert not matrix.violations, matrix.report()


@pytest.mark.django_db(transaction=True)  # channels closes the connection around each ORM call
def test_every_websocket_route_holds_to_its_rule_for_every_persona(personas: list[Persona]) -> None:
    matrix = Matrix()
    for route in websocket_routes():
        rule = rule_for(route)
        assert rule is not None, f"new route {route.key} has no authorization rule: add one to the matrix"
        path = concrete_path(route.route, DEFAULT_VALUES)
        for persona in personas:
            # The Origin is the very host the socket connects to, as a browser on the console sends it.
            headers = [(b"host", b"127.0.0.1"), (b"origin", b"http://127.0.0.1")]
            if persona.user is not None:
                session = persona.client.cookies[settings.SESSION_COOKIE_NAME].value
                headers.append((b"cookie", f"{settings.SESSION_COOKIE_NAME}={session}".encode()))
            headers += [(k.removeprefix("HTTP_").lower().encode(), v.encode()) for k, v in persona.headers.items()]
            accepted, detail = async_to_sync(_connect)(path, headers)
            should = persona.name in rule.methods["CONNECT"]
            got = "accepted" if accepted else f"refused (close code {detail})"
            says = "accepted" if should else "refused"
            matrix.record("CONNECT", path, persona.name, got=got, says=says, held=accepted == should)
    print(f"\nwebsocket authorization matrix: {matrix.checks} checks")
    assert not matrix.violations, matrix.report()


async def _connect(path: str, headers: list[tuple[bytes, bytes]]) -> tuple[bool, Any]:
    communicator = WebsocketCommunicator(application, path, headers=headers)
    accepted, detail = await communicator.connect()
    await communicator.disconnect()
    return accepted, detail
