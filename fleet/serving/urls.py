from django.urls import path

from fleet.serving import views

app_name = "serving"

urlpatterns = [
    path("", views.ServingDashboardView.as_view(), name="dashboard"),
    path("endpoints/<int:pk>/", views.EndpointDetailView.as_view(), name="endpoint_detail"),
]
