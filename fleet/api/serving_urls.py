from django.urls import path

from fleet.api import serving

app_name = "serving-api"

urlpatterns = [
    path("endpoints/<int:pk>/slo", serving.EndpointSloView.as_view(), name="endpoint-slo"),
    path("endpoints/<int:pk>/changes", serving.EndpointChangesView.as_view(), name="endpoint-changes"),
    path("endpoints/<int:pk>/evals", serving.EndpointEvalsView.as_view(), name="endpoint-evals"),
]
