"""The People page (/accounts/people/): an Admin lists people with their role, teams, last sign-in
and tokens, creates a person with a role in one step, changes a role, deactivates (tokens revoked,
sessions ended) and reactivates; every change is audited; nobody else opens it."""

from __future__ import annotations

import re

import pytest
from django.contrib.auth.models import User
from django.contrib.sessions.models import Session
from django.test import Client

from compliance.models import AuditEntry
from console import people, roles
from console.models import PersonalToken
from fleet.capacity.models import Team
from tests.conftest import PASSWORD, _client_for, _make_user

pytestmark = pytest.mark.django_db

URL = "/accounts/people/"


def _sign_in(username: str, password: str) -> Client | None:
    """A real sign-in through the login form (django-axes needs the request): the client, or None."""
    client = Client()
    response = client.post("/accounts/login/", {"username": username, "password": password})
    return client if response.status_code == 302 else None


def _user_entries(user: User) -> list[AuditEntry]:
    return list(AuditEntry.objects.filter(model="user", object_id=str(user.pk)).order_by("pk"))


@pytest.mark.parametrize("who", ["operator_client", "viewer_client", "norole_client"])
def test_only_an_admin_opens_the_people_page(who: str, request: pytest.FixtureRequest) -> None:
    client = request.getfixturevalue(who)
    page = client.get(URL)
    assert page.status_code == 403
    assert "This page is for Admins" in page.content.decode()
    # The POST is refused on the server too, whatever the page showed.
    post = client.post(URL, {"action": "create", "username": "mallory", "role": roles.ADMIN})
    assert post.status_code == 403 and not User.objects.filter(username="mallory").exists()


def test_a_capacity_approver_does_not_open_it_either() -> None:
    client = _client_for(_make_user("cappy", roles.CAPACITY_APPROVER))
    assert client.get(URL).status_code == 403


def test_the_list_shows_role_teams_last_sign_in_tokens_and_status(
    admin_client: Client, operator_user: User, viewer_user: User
) -> None:
    PersonalToken.issue(user=operator_user, name="a")
    PersonalToken.issue(user=operator_user, name="b")
    PersonalToken.issue(user=operator_user, name="c")[0].revoke(actor=operator_user)
    assert _sign_in("vera", PASSWORD)  # a real sign-in sets last_login
    html = admin_client.get(URL).content.decode()
    rows = dict(re.findall(r'<tr data-person="(\w+)"[^>]*>(.*?)</tr>', html, re.S))
    assert set(rows) >= {"ada", "oscar", "vera"}
    assert re.search(r'data-field="role">Operator<', rows["oscar"])
    assert re.search(r'data-field="tokens"[^>]*>2<', rows["oscar"])  # the revoked one not counted
    assert re.search(r'data-field="role">Admin<', rows["ada"])
    assert "never" in rows["oscar"] and "never" not in rows["vera"]
    assert re.search(r'data-field="teams">–<', rows["vera"])  # a member of no team


def test_the_navigation_links_it_for_admins_only(admin_client: Client, operator_client: Client) -> None:
    assert f'href="{URL}"' in admin_client.get("/").content.decode()
    assert f'href="{URL}"' not in operator_client.get("/").content.decode()


def test_an_admin_creates_a_person_with_a_role_and_a_generated_password_shown_once(admin_client: Client) -> None:
    page = admin_client.post(
        URL, {"action": "create", "username": "nina", "email": "nina@example.com", "role": roles.OPERATOR}
    )
    assert page.status_code == 200
    assert page["Cache-Control"].startswith("max-age=0") or "no-cache" in page["Cache-Control"]
    password = re.search(r'id="new-password">([^<]+)<', page.content.decode())[1]  # type: ignore[index]
    nina = User.objects.get(username="nina")
    assert nina.is_active and not nina.is_staff and roles.role_of(nina) == roles.OPERATOR
    assert _sign_in("nina", password)
    assert password not in admin_client.get(URL).content.decode()  # shown once
    created = _user_entries(nina)
    assert created[0].action == "create" and created[0].actor == "ada"
    assert created[0].after["password"] == "[redacted]"
    assert any(e.after.get("groups") == [roles.OPERATOR] for e in created)


def test_a_bad_new_person_is_refused_on_the_field_and_nothing_is_written(admin_client: Client) -> None:
    weak = admin_client.post(URL, {"action": "create", "username": "nina", "role": roles.VIEWER, "password": "123"})
    assert weak.status_code == 400 and 'data-error-for="password"' in weak.content.decode()
    taken = admin_client.post(URL, {"action": "create", "username": "ADA", "role": roles.VIEWER})
    assert taken.status_code == 400 and 'data-error-for="username"' in taken.content.decode()
    role = admin_client.post(URL, {"action": "create", "username": "nina", "role": "Superuser"})
    assert role.status_code == 400 and 'data-error-for="role"' in role.content.decode()
    assert not User.objects.filter(username="nina").exists()


def test_an_admin_changes_a_role_and_the_change_is_audited(admin_client: Client, operator_user: User) -> None:
    response = admin_client.post(URL, {"action": "role", "id": operator_user.pk, "role": roles.CAPACITY_APPROVER})
    assert response.status_code == 302
    operator_user.refresh_from_db()
    assert roles.role_of(operator_user) == roles.CAPACITY_APPROVER
    assert operator_user.has_perm("fleet.approve_capacity") and not operator_user.has_perm("fleet.add_reservation")
    # The role group taken and the new one given: each an entry with the groups before and after.
    changes = [
        (e.before["groups"], e.after["groups"], e.actor)
        for e in _user_entries(operator_user)
        if "groups" in (e.after or {})
    ]
    assert changes[-2:] == [([roles.OPERATOR], [], "ada"), ([], [roles.CAPACITY_APPROVER], "ada")]
    # Made an Admin: staff too (the Django admin is theirs).
    admin_client.post(URL, {"action": "role", "id": operator_user.pk, "role": roles.ADMIN})
    operator_user.refresh_from_db()
    assert operator_user.is_staff and roles.is_admin(operator_user)


def test_the_last_admin_keeps_the_role(admin_user: User, admin_client: Client) -> None:
    response = admin_client.post(URL, {"action": "role", "id": admin_user.pk, "role": roles.VIEWER})
    assert response.status_code == 409 and "last active Admin" in response.content.decode()
    assert roles.is_admin(User.objects.get(pk=admin_user.pk))


def test_deactivating_revokes_tokens_ends_sessions_and_reactivating_lets_them_back(
    admin_client: Client, operator_user: User
) -> None:
    _, plain = PersonalToken.issue(user=operator_user, name="script")
    session_client = _sign_in("oscar", PASSWORD)
    assert session_client is not None
    assert session_client.get("/").status_code == 200
    sessions_before = Session.objects.count()

    response = admin_client.post(URL, {"action": "deactivate", "id": operator_user.pk})
    assert response.status_code == 302
    operator_user.refresh_from_db()
    assert not operator_user.is_active
    assert not PersonalToken.objects.active().filter(user=operator_user).exists()
    assert Session.objects.count() == sessions_before - 1
    assert session_client.get("/").status_code == 302  # signed out: to the login page
    api = Client().get("/api/v1/capacity/pools/", HTTP_AUTHORIZATION=f"Bearer {plain}")
    assert api.status_code in (401, 403)
    assert _sign_in("oscar", PASSWORD) is None
    entries = _user_entries(operator_user)
    assert any((e.before or {}).get("is_active") is True and e.after["is_active"] is False for e in entries)
    assert AuditEntry.objects.filter(model="personaltoken", message="Revoked.").exists()

    assert admin_client.post(URL, {"action": "reactivate", "id": operator_user.pk}).status_code == 302
    assert _sign_in("oscar", PASSWORD)


def test_an_admin_cannot_deactivate_themselves(admin_user: User, admin_client: Client) -> None:
    response = admin_client.post(URL, {"action": "deactivate", "id": admin_user.pk})
    assert response.status_code == 409 and "your own account" in response.content.decode()
    assert User.objects.get(pk=admin_user.pk).is_active


def test_unknown_actions_and_people_are_4xx(admin_client: Client) -> None:
    assert admin_client.post(URL, {"action": "promote"}).status_code == 400
    assert admin_client.post(URL, {"action": "deactivate", "id": "x"}).status_code == 400
    assert admin_client.post(URL, {"action": "deactivate", "id": "999999"}).status_code == 404


def test_the_page_lists_the_teams_a_person_is_a_member_of(
    admin_client: Client, operator_user: User, viewer_user: User
) -> None:
    for name in ("search", "alpha"):
        Team.objects.create(name=name).members.add(operator_user)
    assert people.teams_of(operator_user) == ["alpha", "search"]
    assert people.teams_of(viewer_user) == []
    html = admin_client.get(URL).content.decode()
    rows = dict(re.findall(r'<tr data-person="(\w+)"[^>]*>(.*?)</tr>', html, re.S))
    # each team named, and linked to its page
    alpha, search = (Team.objects.get(name=n).pk for n in ("alpha", "search"))
    linked = (
        f'data-field="teams"><a href="/capacity/teams/{alpha}/">alpha</a>, '
        f'<a href="/capacity/teams/{search}/">search</a><'
    )
    assert linked in rows[operator_user.username]


def test_the_people_page_cannot_make_a_superuser(admin_client: Client, operator_user: User) -> None:
    """Issue 37, item 7: only ``manage.py createsuperuser`` makes one; a posted flag is ignored."""
    created = admin_client.post(URL, {"action": "create", "username": "sam", "role": roles.ADMIN, "is_superuser": "on"})
    assert created.status_code == 200
    sam = User.objects.get(username="sam")
    assert (sam.is_staff, sam.is_superuser) == (True, False)

    promoted = admin_client.post(
        URL, {"action": "role", "id": operator_user.pk, "role": roles.ADMIN, "is_superuser": "on"}
    )
    assert promoted.status_code == 302
    operator_user.refresh_from_db()
    assert roles.role_of(operator_user) == roles.ADMIN and operator_user.is_superuser is False
    assert 'name="is_superuser"' not in admin_client.get(URL).content.decode()
