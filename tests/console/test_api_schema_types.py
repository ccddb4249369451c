"""The API schema describes every answer (issue 38, item 6b): no 2xx JSON answer of /api/v1/ is an
untyped object in /api/schema/, and the real answers of a seeded fleet hold to their schema to the
letter (tests/console/openapi.strict: every documented field present with its type and nullability,
no undocumented field).

The fleet is the API goldens' (tests/fleet/test_api_snapshot), seeded through the same doors, with
what the goldens do not need on top: node_exporter pushes (fabric, storage), Kueue's queues mapped
to a pool (the plan's queues, the quota drift), prices, a recovery register and a training hang.
"""

from __future__ import annotations

import re
from datetime import timedelta
from decimal import Decimal
from typing import Any

import pytest
from django.test import Client

from compliance.choices import BackupMethod, BackupOutcome, RecoveryKind
from compliance.models import BackupReport, RecoveryItem, RestoreTest
from fleet.models import Endpoint, Gpu, Pool, PoolPrice, PriceMode, SchedulerQueue, Team
from incidents.detectors import source_of
from incidents.services.engine import raise_finding
from tests.console.openapi import answer_errors, json_responses, untyped_parts
from tests.fleet import test_api_snapshot as goldens
from tests.fleet.fabric.node_exporter import FIXTURE as NODE_EXPORTER
from tests.fleet.fabric.node_exporter import push as push_node_exporter
from tests.fleet.scheduler.support import KUEUE
from tests.fleet.scheduler.support import push as push_exposition
from tests.fleet.test_api_snapshot import (
    NOW,
    World,
    ok,
    run_beat,
    seed_capacity,
    seed_dcgm,
    seed_gpus,
    seed_serving,
    seed_training,
)

clock = goldens.clock  # the goldens' fixtures: "now" fixed at NOW, and the people and doors seeding
world = goldens.world

API = "/api/v1/"
# Nested fields whose shape is, by design, not one shape: each named with why.
FREE_FORM = {
    "before": "an audit entry's copy of whichever register record changed, as it was",
    "after": "the same record after the change",
    "document": "a transparency summary's template sections as published (kept as they were then)",
    "detail": "a retention run's particulars, which differ by data class",
    "impact": "a finding's figures, which differ by detector",
    "data": "a timeline entry's particulars, which differ by kind",
}


# Detail routes whose lists are empty in this fleet (no compliance records, silences, channels,
# maintenance windows, action items or scrape targets): their list routes are read, empty.
NOTHING_TO_READ = {
    "/api/v1/action-items/{id}/",
    "/api/v1/fleet/scrape-targets/{id}/",
    "/api/v1/maintenance-windows/{id}/",
    "/api/v1/notification-channels/{id}/",
    "/api/v1/silences/{id}/",
    *(
        f"/api/v1/compliance/{route}/{{id}}/"
        for route in (
            "datasets",
            "lineage",
            "models",
            "packs",
            "processing/processor-records",
            "processing/records",
            "processing/requests",
            "retention/holds",
            "retention/policies",
            "retention/runs",
        )
    ),
}


def schema_document(client: Client) -> dict[str, Any]:
    response = client.get("/api/schema/", HTTP_ACCEPT="application/json")
    assert response.status_code == 200, response.content[:500]
    return response.json()


# --- every answer typed ------------------------------------------------------------------------


def untyped_answers(document: dict[str, Any]) -> list[str]:
    """Each 2xx JSON answer of /api/v1/ the schema leaves untyped, as METHOD path status: where."""
    found = []
    for method, path, status, schema in json_responses(document):
        if not path.startswith(API):
            continue
        parts = list(untyped_parts(document, schema))
        untyped = [p for p in parts if p == "$" or p.rsplit(".", 1)[-1] not in FREE_FORM]
        if untyped:
            found.append(f"{method.upper()} {path} {status}: {', '.join(untyped[:5])}")
    return found


@pytest.mark.django_db
def test_every_2xx_json_answer_of_the_api_is_typed_in_the_schema(admin_client: Client) -> None:
    document = schema_document(admin_client)
    answers = list(json_responses(document))
    assert len(answers) > 150  # the whole API was walked, not an empty document
    found = untyped_answers(document)
    assert not found, "answers the schema does not describe:\n" + "\n".join(found)


def test_the_walk_finds_an_untyped_answer_wherever_it_hides() -> None:
    typed = {"type": "object", "properties": {"n": {"type": "integer"}}}
    document: dict[str, Any] = {
        "components": {"schemas": {"Typed": typed, "Loose": {"type": "object", "additionalProperties": {}}}},
        "paths": {},
    }
    assert list(untyped_parts(document, {"$ref": "#/components/schemas/Typed"})) == []
    assert list(untyped_parts(document, {"type": "object"})) == ["$"]  # OpenApiTypes.OBJECT
    assert list(untyped_parts(document, {"$ref": "#/components/schemas/Loose"})) == ["$"]
    assert list(untyped_parts(document, None)) == ["$"]  # a body without a schema
    nested = {"type": "object", "properties": {"rows": {"type": "array", "items": {"type": "object"}}}}
    assert list(untyped_parts(document, nested)) == ["$.rows[]"]
    free_form = {"type": "object", "properties": {"impact": {"type": "object"}}}
    assert list(untyped_parts(document, {"allOf": [typed, free_form]})) == ["$.impact"]
    # A planted operation: the check names it (and lets a known free-form field through).
    document["paths"] = {
        "/api/v1/planted/": {"get": {"responses": {"200": {"content": {"application/json": {"schema": free_form}}}}}},
        "/api/v1/loose/": {"get": {"responses": {"200": {"content": {"application/json": {"schema": {}}}}}}},
    }
    assert untyped_answers(document) == ["GET /api/v1/loose/ 200: $"]


# --- real answers against their schema ---------------------------------------------------------


def links_down(exposition: str, more: int) -> str:
    """node_exporter's text with ``more`` link downs and symbol errors on the port mlx5_1."""
    return re.sub(
        r'^(node_infiniband_(link_downed|symbol_error)_total\{device="mlx5_1".*\}) (\S+)$',
        lambda m: f"{m[1]} {float(m[3]) + more}",
        exposition,
        flags=re.M,
    )


def seed_the_rest(w: World, jobs: dict[str, int], endpoints: dict[str, int]) -> None:
    """What the goldens' fleet lacks for the other read models (see the module's docstring)."""
    # node_exporter three times a minute apart, the second InfiniBand port's links going down.
    for k, minutes in enumerate((2, 1, 0)):
        w.clock.now = NOW - timedelta(minutes=minutes)
        body = links_down(NODE_EXPORTER, 7 * k)
        assert push_node_exporter(w.agent, w.token_a, body, query="?hostname=ams-n000").status_code == 202
    w.clock.now = NOW
    assert push_exposition(w.agent, w.token_a, KUEUE).status_code == 202
    SchedulerQueue.objects.filter(scheduler="kueue").update(
        pool=Pool.objects.get(name="ams-h100"), team=Team.objects.get(name="alpha")
    )
    for pool in Pool.objects.all():
        PoolPrice.objects.create(
            pool=pool,
            valid_from=NOW.date() - timedelta(days=400),
            currency="EUR",
            mode=PriceMode.OWNED,
            purchase_price_per_gpu=Decimal("25000"),
            depreciation_months=48,
            energy_price_per_kwh=Decimal("0.20"),
            pue=Decimal("1.3"),
            yearly_operations_per_gpu=Decimal("2000"),
            cloud_rate_per_gpu_hour=Decimal("2.00"),
        )
    Endpoint.objects.get(pk=endpoints["llama-70b-chat"]).gpus.set(Gpu.objects.filter(node__hostname="ams-n003"))
    item = RecoveryItem.objects.create(
        kind=RecoveryKind.DATASET,
        name="c4-en",
        method=BackupMethod.REPLICATION,
        source_site=w.site_a,
        source_tier="nfs",
    )
    BackupReport.objects.create(
        item=item,
        external_id="run-1",
        started=NOW - timedelta(hours=3),
        finished=NOW - timedelta(hours=2),
        outcome=BackupOutcome.SUCCESS,
        bytes=2**40,
    )
    RestoreTest.objects.create(
        item=item, into="scratch-nfs", by_name="ops", started=NOW - timedelta(hours=2), finished=NOW, verified=True
    )


def read_model_routes(w: World, jobs: dict[str, int], endpoints: dict[str, int]) -> list[str]:
    """The read models' routes: the answers issue 38 typed, each read with data in it."""
    job, endpoint = jobs["llama-70b-pretrain"], endpoints["llama-70b-chat"]
    gpu = ok(w.viewer.get("/api/v1/fleet/gpus/", {"node": "ams-n000"}))["results"][0]["uuid"]
    return [
        f"/api/v1/serving/endpoints/{endpoint}/slo",
        "/api/v1/serving/overview",
        f"/api/v1/serving/endpoints/{endpoint}/snapshot?range=7d",
        "/api/v1/training/overview?range=24h",
        f"/api/v1/training/jobs/{job}/snapshot",
        "/api/v1/fleet/overview/?range=1h",
        f"/api/v1/fleet/gpu-table/?site_id={w.site_a.pk}",
        f"/api/v1/fleet/gpus/{gpu}/series/",
        "/api/v1/fleet/nodes/ams-n000/series/?range=1h",
        "/api/v1/capacity/plan?months=9",
        "/api/v1/fabric/?range=1h",
        "/api/v1/storage/?range=1h",
        "/api/v1/power/",
        "/api/v1/cost/",
        *(f"/api/v1/cost/{part}/" for part in ("training", "idle", "reserved", "incidents", "serving", "own-or-rent")),
        "/api/v1/scheduler/quota-drift/?all=1",
        "/api/v1/recovery/items/",
    ]


def filled(body: Any, *paths: str) -> None:
    """Each dotted path of the answer holds a non-empty list or object: its items' schema was tried."""
    for path in paths:
        value = body
        for key in path.split("."):
            value = value[int(key)] if isinstance(value, list) else value[key]
        assert value, f"{path} is empty: the answer does not try its items' schema"


def list_routes(document: dict[str, Any]) -> list[str]:
    """The GET routes of /api/v1/ with a JSON answer whose path has at most one parameter, last."""
    answered = {path for method, path, _, _ in json_responses(document) if method == "get"}
    return sorted(p for p in answered if p.startswith(API) and re.fullmatch(r"[^{}]*(\{\w+\}/)?", p))


@pytest.mark.django_db
def test_real_answers_of_the_api_match_their_schema_to_the_letter(world: World) -> None:
    w = world
    seed_gpus(w)
    seed_dcgm(w)
    endpoints = seed_serving(w)
    jobs = seed_training(w)
    approvals = seed_capacity(w)
    run_beat("update-rollups", "update-serving-rollups", "refresh-training-accounts", "advance-reservations")
    seed_the_rest(w, jobs, endpoints)
    run_beat("run-detectors", times=1)
    # A hang of the running job, as the detector names it: an episode on the job's page.
    raise_finding(
        f"training-hang:{jobs['llama-70b-pretrain']}",
        {"site": "ams-1", "job": str(jobs["llama-70b-pretrain"]), "hostname": "ams-n000"},
        "SEV3",
        "llama-70b-pretrain made no step for 12 minutes",
        source=source_of("training-hang"),
        started_at=NOW - timedelta(minutes=15),
    )
    document = schema_document(w.admin)
    errors: list[str] = []
    answers: dict[str, Any] = {}

    def check(client: Client, url: str) -> Any:
        body = ok(client.get(url), 200)
        errors.extend(answer_errors(document, "get", url.split("?")[0], 200, body))
        answers[url.split("?")[0]] = body
        return body

    # The read models (as an Admin: the recovery register is not a Viewer's), with their lists full.
    for url in read_model_routes(w, jobs, endpoints):
        check(w.admin, url)
    read = {route.split("/api/v1/", 1)[1].split("?")[0]: body for route, body in answers.items()}
    job, endpoint = jobs["llama-70b-pretrain"], endpoints["llama-70b-chat"]
    filled(read[f"serving/endpoints/{endpoint}/snapshot"], "changes", "evals", "alerts", "since_start.gauges")
    filled(read[f"training/jobs/{job}/snapshot"], "episodes.0.nodes", "losses", "markers.checkpoints", "advice")
    filled(read["training/overview"], "top_jobs", "running")
    filled(read["fabric/"], "worst_ports", "flaps", "sites.0.racks")
    filled(read["storage/"], "mounts.0.jobs", "servers")
    filled(read["power/"], "sites.0.racks", "series.sites")
    filled(read["capacity/plan"], "queues.0.queues", "quota_waits")
    filled(read["cost/"], "by_cause", "top_jobs", "serving.0.windows", "own_or_rent.0.periods")
    filled(read["cost/training/"], "rows")
    filled(read["scheduler/quota-drift/"], "results.0.differences")
    filled(read["recovery/items/"], "results.0.last_good_backup", "results.0.last_restore_test")
    # What the reservations' approvals answered while the capacity was seeded.
    approved = [answer["body"] for answer in approvals if answer["status"] == 200]
    assert approved
    for body in approved:
        errors.extend(answer_errors(document, "post", "/api/v1/capacity/reservations/1/approve/", 200, body))
    # Every other list and detail route an Admin reads, with the first item of its list.
    unread = []
    for route in list_routes(document):
        if route in answers:
            continue
        if "{" not in route:
            check(w.admin, route)
            continue
        listing = answers.get(route.rsplit("{", 1)[0]) or {}
        rows = listing.get("results", listing) if isinstance(listing, dict) else listing
        key = route.rsplit("{", 1)[1].split("}")[0]
        if not rows or not isinstance(rows, list) or key not in rows[0]:
            unread.append(route)
            continue
        check(w.admin, route.replace(f"{{{key}}}", str(rows[0][key])))
    assert not errors, f"{len(errors)} answers break their schema:\n" + "\n".join(errors[:40])
    assert len(answers) > 60
    assert set(unread) <= NOTHING_TO_READ, f"detail routes not read: {sorted(set(unread) - NOTHING_TO_READ)}"
