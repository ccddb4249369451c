from django.urls import path

from fleet import views_capacity

app_name = "capacity"

urlpatterns = [
    path("", views_capacity.CapacityPlanView.as_view(), name="plan"),
    path("reservations/", views_capacity.ReservationListView.as_view(), name="reservations"),
]
