"""Schemathesis against the console's own OpenAPI schema: every operation, as an admin and as a
viewer (the Prometheus and Alertmanager doors with an agent token), with cases generated from the
schema. Zero server errors and zero responses that break the schema.

Outbound addresses the cases make up (scrape target URLs, notification channel URLs) never leave
the machine: the outbound allow-list is narrowed to one loopback address nothing listens on.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator
from typing import Any

import pytest
import schemathesis
from django.core.wsgi import get_wsgi_application
from django.test import Client
from hypothesis import HealthCheck, Phase, given, settings
from schemathesis.checks import not_a_server_error
from schemathesis.specs.openapi.checks import response_schema_conformance

from console.models import AgentToken

EXAMPLES_PER_OPERATION = 14
AGENT_PATHS = ("/api/v1/ingest/", "/api/v1/alertmanager")


def session_headers(user: Any) -> dict[str, Any]:
    """Cookies and the CSRF header of a signed-in session, as a browser would send them."""
    from django.middleware.csrf import _get_new_csrf_string

    client = Client()
    client.force_login(user)
    csrf = _get_new_csrf_string()  # the cookie's secret, sent back in the header as a browser's JS would
    session = client.cookies["sessionid"].value
    return {"headers": {"X-CSRFToken": csrf}, "cookies": {"sessionid": session, "csrftoken": csrf}}


# A real transaction per request, as in production: the WSGI app closes its connection after each.
@pytest.mark.django_db(transaction=True)
def test_every_operation_survives_generated_cases_as_admin_and_viewer(admin_user, viewer_user, site_a, settings_):
    schema_doc = Client()
    schema_doc.force_login(admin_user)
    document = schema_doc.get("/api/schema/", HTTP_ACCEPT="application/json").json()
    schema = schemathesis.openapi.from_dict(document)
    schema.app = get_wsgi_application()
    agent = {"headers": {"Authorization": f"Bearer {AgentToken.issue(site=site_a, name='fuzz-agent')[1]}"}}
    personas = {"admin": session_headers(admin_user), "viewer": session_headers(viewer_user)}
    statuses: Counter[int] = Counter()
    failures: list[str] = []
    cases = 0

    def fuzz(operation: Any, persona: str, credentials: dict[str, Any]) -> None:
        @settings(
            max_examples=EXAMPLES_PER_OPERATION,
            deadline=None,
            database=None,
            phases=[Phase.generate],
            suppress_health_check=list(HealthCheck),
        )
        @given(case=operation.as_strategy())
        def run(case: Any) -> None:
            nonlocal cases
            cases += 1
            response = case.call(**credentials)
            statuses[response.status_code] += 1
            try:
                case.validate_response(response, checks=[not_a_server_error, response_schema_conformance])
            except Exception as exc:  # collect every failure: one run shows them all
                failures.append(f"{persona} {operation.label}: {response.status_code} {str(exc)[:600]}")

        run()

    for result in schema.get_all_operations():
        operation = result.ok()
        agent_door = operation.path.startswith(AGENT_PATHS)
        for persona, credentials in ({"agent": agent} if agent_door else personas).items():
            fuzz(operation, persona, credentials)

    print(f"{cases} cases, statuses {dict(sorted(statuses.items()))}")
    assert cases >= 1000
    assert not failures, "\n\n".join(failures[:30]) + f"\n\n({len(failures)} failures)"


@pytest.fixture
def settings_(settings: Any, monkeypatch: pytest.MonkeyPatch) -> Iterator[Any]:
    """Generated URLs may name any address: outbound requests may reach only a loopback address
    where nothing listens, and made-up host names are not looked up in DNS (resolution is the
    one boundary replaced: an address literal resolves to itself, a name does not resolve)."""
    import ipaddress
    import socket

    settings.OUTBOUND_ALLOWED_NETWORKS = ["127.0.0.254/32"]
    real = socket.getaddrinfo

    def literal_only(host: Any, *args: Any, **kwargs: Any) -> Any:
        try:
            ipaddress.ip_address(str(host).strip("[]"))
        except ValueError:
            raise socket.gaierror(socket.EAI_NONAME, "not looked up in this test") from None
        return real(host, *args, **kwargs)

    monkeypatch.setattr(socket, "getaddrinfo", literal_only)
    yield settings
