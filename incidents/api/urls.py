from rest_framework.routers import DefaultRouter

from incidents.api import views

app_name = "incidents-api"

router = DefaultRouter()
router.register("incidents", views.IncidentViewSet)
router.register("timeline-entries", views.TimelineEntryViewSet)
router.register("action-items", views.ActionItemViewSet)
router.register("silences", views.SilenceViewSet)
router.register("maintenance-windows", views.MaintenanceWindowViewSet)
router.register("notification-channels", views.NotificationChannelViewSet)

urlpatterns = router.urls
