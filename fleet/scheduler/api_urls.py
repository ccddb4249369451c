from django.urls import path
from rest_framework.routers import DefaultRouter

from fleet.scheduler import api

app_name = "scheduler-api"

router = DefaultRouter()
router.register("queues", api.SchedulerQueueViewSet)

urlpatterns = [
    path("quota-drift/", api.QuotaDriftView.as_view(), name="quota-drift"),
    path("quota-drift/import/", api.QuotaImportView.as_view(), name="quota-drift-import"),
    *router.urls,
]
