from django.urls import path

from fleet.storage import views

app_name = "storage"

urlpatterns = [
    path("", views.StorageDashboardView.as_view(), name="dashboard"),
]
