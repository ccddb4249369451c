from django.urls import path

from fleet.power import views

app_name = "power"

urlpatterns = [
    path("", views.PowerDashboardView.as_view(), name="dashboard"),
]
