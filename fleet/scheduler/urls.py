from django.urls import path

from fleet.scheduler import views

app_name = "scheduler"

urlpatterns = [
    path("queues/", views.SchedulerQueuesView.as_view(), name="queues"),
]
