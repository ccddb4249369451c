"""The recovery pages, under /recovery/ (goodput.urls); the API is compliance.recovery.api_urls."""

from __future__ import annotations

from django.urls import URLPattern, URLResolver, path

from compliance.recovery import views

app_name = "recovery"

urlpatterns: list[URLPattern | URLResolver] = [
    path("", views.RegisterView.as_view(), name="register"),
    path("items/<int:pk>/", views.ItemView.as_view(), name="item"),
]
