"""The recovery pages, under /recovery/ (goodput.urls); the API is compliance.urls_recovery."""

from __future__ import annotations

from django.urls import URLPattern, URLResolver, path

from compliance import views_recovery

app_name = "recovery"

urlpatterns: list[URLPattern | URLResolver] = [
    path("", views_recovery.RegisterView.as_view(), name="register"),
    path("items/<int:pk>/", views_recovery.ItemView.as_view(), name="item"),
]
