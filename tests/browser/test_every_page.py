"""Every page of the console, in headless Chromium on a closed network, on a desk and on a phone.

The pages are enumerated from the URL resolver (every GET page outside the API and the admin), so a
new page is covered without touching this file; a new page that takes an argument must name a real
object in PAGE_KWARGS below, or the test fails saying so. Each page is loaded at 1440x900 and at
390x844 with every request that does not go to the console's own origin aborted, as on an air-gapped
network: no console error, no failed request, and no horizontal scroll on the phone.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from typing import Any
from urllib.parse import urlsplit

import pytest
import requests
from django.contrib.auth.models import User
from django.urls import URLPattern, URLResolver, get_resolver, reverse
from rest_framework.views import APIView

from compliance.models import BackupReport, Dataset, GpaiModel, Lineage, RecoveryItem, RestoreTest
from compliance.services import summary
from fleet.models import (
    Endpoint,
    Gpu,
    GpuState,
    Job,
    Pool,
    PowerApproval,
    ProcurementOrder,
    Reservation,
    SchedulerQueue,
    Site,
    Team,
    TeamQuota,
)
from incidents.services.engine import raise_finding
from tests.browser.support import ARTIFACTS, BrowserLog, launch, wait_for, wait_until
from tests.conftest import PASSWORD, make_sample
from tests.fleet.fabric.node_exporter import FIXTURE as NODE_EXPORTER_FIXTURE
from tests.fleet.scheduler.support import KUEUE as KUEUE_FIXTURE
from tests.stack import Stack

pytestmark = [pytest.mark.browser]

DESK = {"width": 1440, "height": 900}
PHONE = {"width": 390, "height": 844}
SKIPPED_PREFIXES = ("api/", "admin/")  # the JSON API and Django's admin are not console pages
DOWNLOADS = (".csv",)  # files, not pages: their own tests check them
LOGIN = "login"  # loaded signed out: signed in, it redirects home

GPU_UUID = "GPU-00000000-0000-4000-8000-000000000101"
HOSTNAME = "gpu-a-101"


def _walk(patterns: list[Any], prefix: str = "", namespace: str = "") -> Iterator[tuple[str, str, URLPattern]]:
    for p in patterns:
        if isinstance(p, URLResolver):
            ns = f"{namespace}{p.namespace}:" if p.namespace else namespace
            yield from _walk(p.url_patterns, prefix + str(p.pattern), ns)
        elif isinstance(p, URLPattern):
            yield prefix + str(p.pattern), f"{namespace}{p.name}" if p.name else "", p


def page_routes() -> list[tuple[str, str]]:
    """(route, name) of every GET page: a class-based view that answers GET, outside the API/admin."""
    pages = []
    for route, name, pattern in _walk(get_resolver().url_patterns):
        view = getattr(pattern.callback, "view_class", None)
        if route.startswith(SKIPPED_PREFIXES) or route.endswith(DOWNLOADS) or view is None or issubclass(view, APIView):
            continue  # function views are the probes (/healthz, /readyz); APIViews speak JSON or text
        if "get" in view.http_method_names and hasattr(view, "get"):
            pages.append((route, name))
    return sorted(pages)


def _post_samples(stack: Stack, token: str) -> None:
    now = datetime.now(UTC)
    samples = [
        make_sample(gpu_uuid=GPU_UUID, hostname=HOSTNAME, gpu_index=0, ts=(now - timedelta(seconds=age)).isoformat())
        for age in (45, 30, 15, 0)
    ]
    response = requests.post(
        stack.base_url + "/api/v1/ingest/gpu-samples",
        json={"samples": samples},
        headers={"Authorization": f"Bearer {token}"},
        timeout=10,
    )
    assert response.status_code == 202, response.text
    # node_exporter's ports, mounts and disks, so the fabric and storage pages and the node page draw them
    response = requests.post(
        stack.base_url + f"/api/v1/ingest/prometheus?hostname={HOSTNAME}",
        data=NODE_EXPORTER_FIXTURE,
        headers={"Authorization": f"Bearer {token}", "Content-Type": "text/plain; version=0.0.4"},
        timeout=10,
    )
    assert response.status_code == 202, response.text


def _capacity_data(site: Site) -> None:
    """A pool of the reporting GPU's model with a late order, a grid approval, a quota and
    reservations (one over-committing), so the capacity pages draw their chart and tables."""
    pool = Pool.objects.create(site=site, gpu_model=Gpu.objects.get(uuid=GPU_UUID).model, name="every-page")
    today = datetime.now(UTC).date()
    ProcurementOrder.objects.create(
        pool=pool, count=8, ordered_on=today - timedelta(days=300), promised_on=today - timedelta(days=5)
    )
    ProcurementOrder.objects.create(pool=pool, count=8, ordered_on=today, promised_on=today + timedelta(days=90))
    PowerApproval.objects.create(site=site, added_kw=20, expected_on=today + timedelta(days=60), status="approved")
    qa, ml = Team.objects.create(name="qa"), Team.objects.create(name="ml")
    TeamQuota.objects.create(pool=pool, team=qa, nominal_gpus=1, borrowing_limit_gpus=1)
    start = datetime.now(UTC) - timedelta(days=1)
    Reservation.objects.create(
        pool=pool, team=qa, gpus=2, start=start, end=start + timedelta(days=40), state="approved"
    )
    Reservation.objects.create(
        pool=pool, team=ml, gpus=1, start=start, end=start + timedelta(days=9), state="requested"
    )


def _scheduler_data(stack: Stack, token: str) -> None:
    """Kueue's ClusterQueues pushed through the door, one mapped to the capacity pool and a team whose
    quota differs from Kueue's, so the queues page draws its mapping and drift tables."""
    response = requests.post(
        stack.base_url + "/api/v1/ingest/prometheus",
        data=KUEUE_FIXTURE,
        headers={"Authorization": f"Bearer {token}", "Content-Type": "text/plain; version=0.0.4"},
        timeout=10,
    )
    assert response.status_code == 202, response.text
    wait_for(lambda: SchedulerQueue.objects.filter(name="team-a-h100").exists(), "the worker to register the queues")
    SchedulerQueue.objects.filter(name="team-a-h100").update(
        pool=Pool.objects.get(name="every-page"), team=Team.objects.get(name="qa")
    )


def _summarised_model() -> GpaiModel:
    """A model with a dataset and its training-content summary published twice (so the pages show
    a version, its hash and a diff)."""
    model = GpaiModel.objects.create(name="every-page", version="1", provider_name="Goodput Labs")
    dataset = Dataset.objects.create(
        name="every-page-web", source_category="crawled", modality="text", size=5 * 10**9, size_unit="tokens"
    )
    Lineage.objects.create(model=model, dataset=dataset)
    summary.publish(model, user=None)
    GpaiModel.objects.filter(pk=model.pk).update(provider_contact="ai-office@goodput.example")
    summary.publish(model, user=None)
    return model


def _recovery_item(dataset: Dataset) -> RecoveryItem:
    """A dataset's recovery item with a week of nightly backups and a verified restore test, so the
    recovery pages draw their tables."""
    site = Site.objects.order_by("pk").first()
    item = RecoveryItem.objects.create(
        kind="dataset", name="every-page-web", dataset=dataset, method="replication", source_site=site
    )
    now = datetime.now(UTC)
    for day in range(7):
        finished = now - timedelta(days=day, hours=2)
        BackupReport.objects.create(
            item=item,
            external_id=f"every-page-{day}",
            started=finished - timedelta(minutes=30),
            finished=finished,
            bytes=10**10,
            outcome="failed" if day == 3 else "success",
            copy_site=site,
            copy_tier="object-store",
        )
    RestoreTest.objects.create(
        item=item,
        by_name="every page",
        into="scratch",
        started=now - timedelta(days=2, hours=1),
        finished=now - timedelta(days=2),
        verified=True,
        verification="checksums matched",
    )
    return item


def _page_kwargs(incident_id: int) -> dict[str, dict[str, Any]]:
    """Real objects for the pages that show one thing."""
    return {
        "fleet:gpu_detail": {"uuid": GPU_UUID},
        "fleet:node_detail": {"hostname": HOSTNAME},
        "incidents:detail": {"pk": incident_id},
        "training:job_detail": {
            "pk": Job.objects.get_or_create(
                site=Site.objects.order_by("pk").first(),
                scheduler_id="every-page",
                defaults={"name": "every-page", "team": "qa", "gang_size": 8},
            )[0].pk
        },
        "serving:endpoint_detail": {
            "pk": Endpoint.objects.get_or_create(site=Site.objects.order_by("pk").first(), name="every-page")[0].pk
        },
        "compliance:summary": {"pk": (summarised := _summarised_model()).pk},
        "compliance:summary-version": {"pk": summarised.pk, "version": 2},
        "compliance:model-detail": {"pk": summarised.pk},
        "compliance:dataset-detail": {"pk": summarised.lineage.get().dataset_id},
        "recovery:item": {"pk": _recovery_item(summarised.lineage.get().dataset).pk},
        # qa: a quota, reservations and a Kueue queue mapped to it (_capacity_data, _scheduler_data)
        "capacity:team": {"pk": Team.objects.get(name="qa").pk},
        "docs:page": {"page": "incidents"},  # a page of the manual with tables, code and links
    }


def _urls(incident_id: int) -> list[str]:
    kwargs = _page_kwargs(incident_id)
    urls, missing = [], []
    for route, name in page_routes():
        if name == LOGIN:
            continue
        if "<" in route and name not in kwargs:
            missing.append(f"{name or route}")
            continue
        urls.append(reverse(name, kwargs=kwargs.get(name)) if name else "/" + route)
    assert not missing, f"pages that take an argument need a real object in _page_kwargs: {missing}"
    return urls


def _same_origin_only(context: Any, base_url: str, blocked: list[str]) -> None:
    origin = urlsplit(base_url)

    def handle(route: Any) -> None:
        url = urlsplit(route.request.url)
        if (url.scheme, url.netloc) == (origin.scheme, origin.netloc) or url.scheme == "data":
            route.continue_()
        else:
            blocked.append(route.request.url)
            route.abort()

    context.route("**/*", handle)


def _visit(context: Any, base_url: str, path: str, viewport: dict[str, int], blocked: list[str]) -> list[str]:
    """Load one page; return what went wrong on it."""
    page = context.new_page()
    log = BrowserLog(page, "/api/")
    failed: list[str] = []
    page.on("requestfailed", lambda r: failed.append(f"failed request: {r.url} ({r.failure})"))
    blocked_before = len(blocked)
    try:
        response = page.goto(base_url + path, wait_until="load")
        problems = [] if response is not None and response.ok else [f"GET {path}: {response and response.status}"]
        if page.query_selector("#live-status"):
            # Live pages: the socket is up and the snapshot has been asked for and drawn.
            wait_until(page, "document.getElementById('live-status').classList.contains('on')")
        page.wait_for_load_state("networkidle")
        if viewport == PHONE:
            width = page.evaluate("document.documentElement.scrollWidth")
            if width > PHONE["width"]:
                wide = page.evaluate(
                    """() => [...document.querySelectorAll('body *')]
                      .filter(e => e.getBoundingClientRect().right > innerWidth + 1)
                      .slice(0, 5).map(e => e.tagName + (e.id ? '#' + e.id : '') + '.' + e.className)"""
                )
                problems.append(f"{path} is {width} px wide on a {PHONE['width']} px screen; too wide: {wide}")
        ARTIFACTS.mkdir(exist_ok=True)
        name = re.sub(r"[^a-z0-9]+", "-", path.lower()).strip("-") or "home"
        page.screenshot(path=str(ARTIFACTS / f"page-{name}-{viewport['width']}.png"), full_page=True)
        problems += [f"{path}: {e}" for e in log.errors + failed]
        problems += [f"{path}: left the console's origin for {u}" for u in blocked[blocked_before:]]
        return problems
    finally:
        page.close()


def _sign_in(context: Any, base_url: str, username: str) -> None:
    page = context.new_page()
    page.goto(f"{base_url}/accounts/login/")
    page.fill("#id_username", username)
    page.fill("#id_password", PASSWORD)
    with page.expect_navigation():
        page.click("form button[type=submit]")
    assert page.url == base_url + "/", f"signing in did not land home: {page.url}"
    page.close()


def test_the_pages_are_enumerated_from_the_url_conf() -> None:
    names = {name for _, name in page_routes()}
    assert {"home", "login", "fleet:dashboard", "fleet:gpu_detail", "incidents:list", "incidents:detail"} <= names
    assert not names & {"healthz", "readyz", "metrics", "logout", "incidents:act", "api-docs", "schema"}
    assert not [r for r, _ in page_routes() if r.startswith(SKIPPED_PREFIXES)]


def test_every_page_works_offline_on_desk_and_phone(stack: Stack, admin_user: User, site_a: Site, token_a: str) -> None:
    _post_samples(stack, token_a)
    wait_for(lambda: GpuState.objects.filter(gpu__uuid=GPU_UUID).exists(), "the worker to store the samples")
    finding = raise_finding(
        f"test:xid:{GPU_UUID}",
        {"site": site_a.name, "node": HOSTNAME, "gpu": GPU_UUID},
        "SEV2",
        f"XID 79 on {HOSTNAME} GPU 0",
    )
    _capacity_data(site_a)
    _scheduler_data(stack, token_a)
    urls = _urls(finding.incident_id)
    username = admin_user.username

    from playwright.sync_api import sync_playwright

    problems: list[str] = []
    visited = 0
    with sync_playwright() as pw:
        browser = launch(pw)
        try:
            for viewport in (DESK, PHONE):
                blocked: list[str] = []
                signed_out = browser.new_context(viewport=viewport)
                _same_origin_only(signed_out, stack.base_url, blocked)
                problems += [
                    f"[{viewport['width']}] {p}"
                    for p in _visit(signed_out, stack.base_url, reverse(LOGIN), viewport, blocked)
                ]
                signed_out.close()

                context = browser.new_context(viewport=viewport)
                _same_origin_only(context, stack.base_url, blocked)
                _sign_in(context, stack.base_url, username)
                for path in urls:
                    problems += [
                        f"[{viewport['width']}] {p}" for p in _visit(context, stack.base_url, path, viewport, blocked)
                    ]
                    visited += 1
                context.close()
        finally:
            browser.close()

    assert visited == 2 * len(urls) >= 2 * 8
    assert not problems, "\n".join(problems)
