"""The admin names every model in plain English: "ingest batches", not "ingest batchs"."""

from __future__ import annotations

import pytest
from django.contrib import admin
from django.test import Client


def _english_plural(singular: str) -> str:
    if singular.endswith(("s", "x", "z", "ch", "sh")):
        return singular + "es"
    if singular.endswith("y") and singular[-2:-1] not in "aeiou":
        return singular[:-1] + "ies"
    return singular + "s"


def test_every_model_in_the_admin_has_an_english_plural() -> None:
    wrong = []
    for model in admin.site._registry:
        opts = model._meta
        singular, plural = str(opts.verbose_name), str(opts.verbose_name_plural)
        if plural == singular + "s" and plural != _english_plural(singular):
            wrong.append(f"{opts.label}: {plural!r}")
    assert wrong == []


@pytest.mark.django_db
def test_the_admin_index_lists_ingest_batches(admin_user) -> None:  # type: ignore[no-untyped-def]
    client = Client()
    client.force_login(admin_user)
    page = client.get("/admin/").content.decode()
    assert "Ingest batches" in page and "batchs" not in page
