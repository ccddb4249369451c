from django.urls import path
from rest_framework.routers import DefaultRouter

from fleet.api import training

app_name = "training-api"

router = DefaultRouter()
router.register("jobs", training.JobViewSet)

urlpatterns = [
    # No trailing slash, like the ingest doors: training clients post here at step rate.
    path("jobs/<int:pk>/events", training.JobEventsView.as_view(), name="job-events"),
    *router.urls,
]
