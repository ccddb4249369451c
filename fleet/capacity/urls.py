from django.urls import path

from fleet.capacity import views

app_name = "capacity"

urlpatterns = [
    path("", views.CapacityPlanView.as_view(), name="plan"),
    path("teams/<int:pk>/", views.TeamView.as_view(), name="team"),
    path("reservations/", views.ReservationListView.as_view(), name="reservations"),
]
