from django.contrib import admin
from django.contrib.auth import views as auth_views
from django.contrib.auth.decorators import login_required
from django.urls import include, path
from drf_spectacular.views import SpectacularAPIView, SpectacularSwaggerSplitView

from console import views
from console.metrics import MetricsView
from incidents.api.alertmanager import AlertmanagerWebhookView

# The admin's own login page would be a second open door: send it to ours instead.
admin.site.login = login_required(admin.site.login)  # type: ignore[method-assign]
admin.site.site_header = "Goodput administration"

api_v1 = [
    path("fleet/", include("fleet.api_urls")),
    path("ingest/", include("fleet.ingest.api_urls")),
    path("training/", include("fleet.training.api_urls")),
    path("serving/", include("fleet.serving.api_urls")),
    path("capacity/", include("fleet.capacity.api_urls")),
    path("power/", include("fleet.power.api_urls")),
    path("fabric/", include("fleet.fabric.api_urls")),
    path("storage/", include("fleet.storage.api_urls")),
    path("scheduler/", include("fleet.scheduler.api_urls")),
    path("cost/", include("fleet.cost.api_urls")),
    path("compliance/", include("compliance.api_urls")),
    path("recovery/", include("compliance.recovery.api_urls")),
    path("alertmanager", AlertmanagerWebhookView.as_view(), name="alertmanager"),
    path("", include("incidents.api.urls")),
]

urlpatterns = [
    path("", views.HomeView.as_view(), name="home"),
    path("healthz", views.healthz, name="healthz"),
    path("readyz", views.readyz, name="readyz"),
    path("metrics", MetricsView.as_view(), name="metrics"),
    path("accounts/login/", auth_views.LoginView.as_view(redirect_authenticated_user=True), name="login"),
    path("accounts/logout/", auth_views.LogoutView.as_view(), name="logout"),
    path("accounts/tokens/", views.PersonalTokenListView.as_view(), name="personal_tokens"),
    path("accounts/tokens/<int:pk>/revoke/", views.PersonalTokenRevokeView.as_view(), name="personal_token_revoke"),
    path("accounts/people/", views.PeopleView.as_view(), name="people"),
    path("fleet/", include("fleet.urls")),
    path("training/", include("fleet.training.urls")),
    path("serving/", include("fleet.serving.urls")),
    path("capacity/", include("fleet.capacity.urls")),
    path("power/", include("fleet.power.urls")),
    path("fabric/", include("fleet.fabric.urls")),
    path("storage/", include("fleet.storage.urls")),
    path("scheduler/", include("fleet.scheduler.urls")),
    path("cost/", include("fleet.cost.urls")),
    path("incidents/", include("incidents.urls")),
    path("compliance/", include("compliance.urls")),
    path("recovery/", include("compliance.recovery.urls")),
    path("api/v1/", include((api_v1, "api"))),
    path("api/schema/", SpectacularAPIView.as_view(), name="schema"),
    # The split view serves its script as a file: no inline script for the Content-Security-Policy to allow.
    path("api/docs/", SpectacularSwaggerSplitView.as_view(url_name="schema"), name="api-docs"),
    path("docs/", include("console.docs")),
    path("admin/", admin.site.urls),
]
