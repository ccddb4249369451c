from django.urls import path

from incidents import views

app_name = "incidents"

urlpatterns = [
    path("", views.IncidentListView.as_view(), name="list"),
    path("metrics/", views.IncidentMetricsView.as_view(), name="metrics"),
    path("silences/", views.SilenceListView.as_view(), name="silences"),
    path("maintenance/", views.MaintenanceView.as_view(), name="maintenance"),
    path("<int:pk>/", views.IncidentDetailView.as_view(), name="detail"),
    path("<int:pk>/act/", views.IncidentActionView.as_view(), name="act"),
]
