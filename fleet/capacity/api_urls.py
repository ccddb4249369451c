from django.urls import path
from rest_framework.routers import DefaultRouter

from fleet.capacity import api as capacity

app_name = "capacity-api"

router = DefaultRouter()
router.register("pools", capacity.PoolViewSet)
router.register("orders", capacity.ProcurementOrderViewSet)
router.register("approvals", capacity.PowerApprovalViewSet)
router.register("quotas", capacity.TeamQuotaViewSet)
router.register("reservations", capacity.ReservationViewSet)

urlpatterns = [
    # Before the router: its format-suffix routes would read "reservations.csv" as a format.
    path("plan", capacity.PlanView.as_view(), name="plan"),
    path("plan.csv", capacity.PlanCsvView.as_view(), name="plan-csv"),
    path("reservations.csv", capacity.ReservationsCsvView.as_view(), name="reservations-csv"),
    *router.urls,
]
