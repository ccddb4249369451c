from django.urls import path

from fleet.serving import api as serving

app_name = "serving-api"

urlpatterns = [
    path("endpoints/<int:pk>/slo", serving.EndpointSloView.as_view(), name="endpoint-slo"),
    path("endpoints/<int:pk>/changes", serving.EndpointChangesView.as_view(), name="endpoint-changes"),
    path("endpoints/<int:pk>/evals", serving.EndpointEvalsView.as_view(), name="endpoint-evals"),
    # The serving pages' snapshots (read-only; the live pushes move them forward).
    path("overview", serving.ServingOverviewView.as_view(), name="overview"),
    path("endpoints/<int:pk>/snapshot", serving.EndpointSnapshotView.as_view(), name="endpoint-snapshot"),
]
