from django.urls import path

from fleet.training import views

app_name = "training"

urlpatterns = [
    path("", views.TrainingDashboardView.as_view(), name="dashboard"),
    path("jobs/<int:pk>/", views.JobDetailView.as_view(), name="job_detail"),
]
