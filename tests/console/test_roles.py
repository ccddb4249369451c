"""Roles are enforced on the server: admin, operator, viewer, no-role user, anonymous."""

from __future__ import annotations

import pytest
from django.contrib.auth.models import Group

from console import roles
from fleet.models import Gpu, Node, Site


@pytest.fixture
def gpu(site_a: Site) -> Gpu:
    node = Node.objects.create(site=site_a, hostname="gpu-a-001")
    return Gpu.objects.create(node=node, index=0, uuid="GPU-11111111-2222-3333-4444-555555555555", model="H100")


@pytest.mark.django_db
def test_the_data_migration_created_the_four_roles() -> None:
    names = set(Group.objects.values_list("name", flat=True))
    assert {roles.VIEWER, roles.OPERATOR, roles.COMPLIANCE_OFFICER, roles.ADMIN} <= names
    viewer = Group.objects.get(name=roles.VIEWER)
    codes = {f"{p.content_type.app_label}.{p.codename}" for p in viewer.permissions.select_related("content_type")}
    assert "console.view_dashboards" in codes
    assert not any(c.split(".")[1].startswith(("add_", "change_", "delete_")) for c in codes)


@pytest.mark.django_db
def test_every_migrate_recreates_the_roles_though_the_last_app_has_no_models() -> None:
    """Django sends post_migrate only to apps with models; the goodput shell, last in
    INSTALLED_APPS, has none, so the roles must wait for the last app that has."""
    from django.apps import apps

    Group.objects.filter(name__in=[roles.ADMIN, roles.VIEWER]).delete()
    # What every `migrate` sends (django.core.management.sql.emit_post_migrate_signal), to the roles' receiver.
    for config in apps.get_app_configs():
        if config.models_module is not None:
            roles.sync_roles_after_migrate(sender=config, apps=apps)
    assert Group.objects.get(name=roles.ADMIN).permissions.exists()
    assert Group.objects.filter(name=roles.VIEWER).exists()


@pytest.mark.parametrize(
    ("persona", "page_status"),
    [("admin_client", 200), ("operator_client", 200), ("viewer_client", 200), ("norole_client", 403)],
)
def test_pages_need_a_role(request, persona: str, page_status: int, site_a: Site) -> None:
    client = request.getfixturevalue(persona)
    for url in ("/", "/fleet/"):
        assert client.get(url).status_code == page_status, url


@pytest.mark.parametrize(
    ("persona", "read", "create_site", "patch_gpu"),
    [
        ("admin_client", 200, 201, 200),
        ("operator_client", 200, 403, 200),
        ("viewer_client", 200, 403, 403),
        ("norole_client", 403, 403, 403),
        ("anon_client", 401, 401, 401),
    ],
)
def test_api_permissions_by_persona(
    request, gpu: Gpu, persona: str, read: int, create_site: int, patch_gpu: int
) -> None:
    client = request.getfixturevalue(persona)
    assert client.get("/api/v1/fleet/gpus/").status_code == read
    assert client.get("/api/v1/fleet/overview/").status_code == read
    response = client.post(
        "/api/v1/fleet/sites/", {"name": "new-site", "region": "eu"}, content_type="application/json"
    )
    assert response.status_code == create_site
    assert Site.objects.filter(name="new-site").exists() == (create_site == 201)
    response = client.patch(
        f"/api/v1/fleet/gpus/{gpu.uuid}/", {"model": "NVIDIA H100 80GB HBM3"}, content_type="application/json"
    )
    assert response.status_code == patch_gpu
    gpu.refresh_from_db()
    assert (gpu.model == "NVIDIA H100 80GB HBM3") == (patch_gpu == 200)


def test_login_page_signs_a_user_in(anon_client, viewer_user) -> None:
    from tests.conftest import PASSWORD

    response = anon_client.post("/accounts/login/", {"username": "vera", "password": PASSWORD, "next": "/fleet/"})
    assert response.status_code == 302 and response["Location"] == "/fleet/"
    assert anon_client.get("/fleet/").status_code == 200


def test_a_wrong_password_is_refused(anon_client, viewer_user) -> None:
    response = anon_client.post("/accounts/login/", {"username": "vera", "password": "nope"})
    assert response.status_code == 200
    assert b"didn&#x27;t match" in response.content or b"didn't match" in response.content
    assert anon_client.get("/fleet/").status_code == 302
