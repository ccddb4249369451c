from django.urls import path
from rest_framework.routers import DefaultRouter

from fleet.training import api as training

app_name = "training-api"

router = DefaultRouter()
router.register("jobs", training.JobViewSet)

urlpatterns = [
    # No trailing slash, like the ingest doors: training clients post here at step rate.
    path("jobs/<int:pk>/events", training.JobEventsView.as_view(), name="job-events"),
    # The training pages' snapshots (read-only; the live pushes move them forward).
    path("overview", training.TrainingOverviewView.as_view(), name="overview"),
    path("jobs/<int:pk>/snapshot", training.JobSnapshotView.as_view(), name="job-snapshot"),
    *router.urls,
]
