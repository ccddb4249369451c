from django.urls import path

from fleet.fabric import views

app_name = "fabric"

urlpatterns = [
    path("", views.FabricDashboardView.as_view(), name="dashboard"),
]
