"""Superusers (issue 37, item 7): only ``manage.py createsuperuser`` makes one. The Django admin
shows ``is_superuser`` read-only to everyone, and an Admin cannot take over a superuser's account
(its password or e-mail) instead; the People page has no way to grant it either (test_people)."""

from __future__ import annotations

from typing import Any

import pytest
from django.contrib.auth.models import User
from django.test import Client
from django.utils import timezone

from tests.conftest import PASSWORD, _client_for

pytestmark = pytest.mark.django_db


def _change_url(user: User) -> str:
    return f"/admin/auth/user/{user.pk}/change/"


def _change_form(user: User, **overrides: Any) -> dict[str, Any]:
    """The admin's change form for ``user`` as a browser posts it, with ``overrides``."""
    joined = timezone.localtime(user.date_joined)
    body = {
        "username": user.username,
        "first_name": user.first_name,
        "last_name": user.last_name,
        "email": user.email,
        "is_active": "on",
        "is_staff": "on" if user.is_staff else "",
        "groups": [g.pk for g in user.groups.all()],
        "date_joined_0": joined.strftime("%Y-%m-%d"),
        "date_joined_1": joined.strftime("%H:%M:%S"),
        "last_login_0": "",
        "last_login_1": "",
        "_save": "Save",
    }
    return {**body, **overrides}


@pytest.fixture
def root() -> User:
    return User.objects.create_superuser("root", "root@example.com", PASSWORD)


def test_an_admin_posting_is_superuser_on_for_themselves_stays_an_admin(admin_client: Client, admin_user: User) -> None:
    """The finding as reported: the change form took ``is_superuser`` from an Admin."""
    page = admin_client.get(_change_url(admin_user))
    assert page.status_code == 200
    html = page.content.decode()
    assert 'name="is_superuser"' not in html and "Superuser status" in html  # shown, not editable

    response = admin_client.post(_change_url(admin_user), _change_form(admin_user, is_superuser="on", email="a@x.io"))
    assert response.status_code == 302  # the rest of the form was saved...
    admin_user.refresh_from_db()
    assert admin_user.email == "a@x.io"
    assert admin_user.is_superuser is False  # ...and the flag was not


def test_an_admin_cannot_make_someone_else_a_superuser(admin_client: Client, operator_user: User) -> None:
    response = admin_client.post(_change_url(operator_user), _change_form(operator_user, is_superuser="on"))
    assert response.status_code == 302
    operator_user.refresh_from_db()
    assert operator_user.is_superuser is False


def test_the_flag_is_read_only_to_a_superuser_too(root: User, operator_user: User) -> None:
    client = _client_for(root)
    assert 'name="is_superuser"' not in client.get(_change_url(operator_user)).content.decode()
    client.post(_change_url(operator_user), _change_form(operator_user, is_superuser="on"))
    operator_user.refresh_from_db()
    assert operator_user.is_superuser is False


def test_an_admin_cannot_take_over_a_superusers_account(admin_client: Client, root: User) -> None:
    """Setting a superuser's password or e-mail would make the Admin one by another door."""
    page = admin_client.get(_change_url(root))
    assert page.status_code == 200 and 'name="_save"' not in page.content.decode()  # view only
    refused = admin_client.post(_change_url(root), _change_form(root, email="mallory@example.com"))
    assert refused.status_code == 403
    password = admin_client.post(
        f"/admin/auth/user/{root.pk}/password/", {"password1": "Mallory-2468!x", "password2": "Mallory-2468!x"}
    )
    assert password.status_code == 403
    root.refresh_from_db()
    assert root.email == "root@example.com" and root.check_password(PASSWORD)


def test_a_superuser_still_manages_other_superusers(root: User) -> None:
    other = User.objects.create_superuser("root2", "root2@example.com", PASSWORD)
    response = _client_for(root).post(_change_url(other), _change_form(other, email="r2@example.com"))
    assert response.status_code == 302
    other.refresh_from_db()
    assert other.email == "r2@example.com" and other.is_superuser is True
