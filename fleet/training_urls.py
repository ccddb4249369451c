from django.urls import path

from fleet import views_training

app_name = "training"

urlpatterns = [
    path("", views_training.TrainingDashboardView.as_view(), name="dashboard"),
    path("jobs/<int:pk>/", views_training.JobDetailView.as_view(), name="job_detail"),
]
