from django.urls import path

from fleet import views_serving

app_name = "serving"

urlpatterns = [
    path("", views_serving.ServingDashboardView.as_view(), name="dashboard"),
    path("endpoints/<int:pk>/", views_serving.EndpointDetailView.as_view(), name="endpoint_detail"),
]
