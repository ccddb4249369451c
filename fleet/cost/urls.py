from django.urls import path

from fleet.cost import views

app_name = "cost"

urlpatterns = [
    path("", views.CostDashboardView.as_view(), name="dashboard"),
]
