"""Approving reservations: energised supply and Kueue-style quotas, checked over the whole window."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.contrib.admin.models import LogEntry
from django.contrib.auth.models import User

from fleet.capacity.actions import reservations
from fleet.capacity.actions.approvals import ConflictError
from fleet.capacity.read import supply
from fleet.choices import PriorityTier
from fleet.models import ProcurementOrder, Rack, Reservation, ReservationState, Site
from tests.fleet.capacity import add_nodes, days_ahead, make_pool, quota, reserve

pytestmark = pytest.mark.django_db


@pytest.fixture
def pool(site_a: Site):  # 16 GPUs installed and energised
    add_nodes(site_a, 2)
    return make_pool(site_a)


def test_an_overcommit_is_refused_naming_the_first_conflicting_window_and_its_teams(pool, operator_user: User) -> None:
    reserve(pool, "alpha", 10, days_ahead(1), days_ahead(5))
    reserve(pool, "beta", 4, days_ahead(3), days_ahead(8))
    reserve(pool, "delta", 6, days_ahead(20), days_ahead(22))  # over again later: not the first window
    new = reserve(pool, "gamma", 4, days_ahead(2), days_ahead(30), state=ReservationState.REQUESTED)
    with pytest.raises(ConflictError) as exc:
        reservations.approve(new, actor=operator_user)
    conflict = exc.value.detail["conflict"]
    assert conflict == {
        "start": days_ahead(3).isoformat(),
        "end": days_ahead(5).isoformat(),
        "teams": ["alpha", "beta", "gamma"],
        "demand": 18,
        "supply": 16,
    }
    new.refresh_from_db()
    assert new.state == ReservationState.REQUESTED
    assert not LogEntry.objects.filter(object_id=str(new.pk)).exists()


def test_a_reservation_that_fits_beside_others_is_approved_with_an_audit_entry(pool, operator_user: User) -> None:
    reserve(pool, "alpha", 10, days_ahead(1), days_ahead(5))
    new = reserve(pool, "gamma", 6, days_ahead(2), days_ahead(9), state=ReservationState.REQUESTED)
    approved = reservations.approve(new, actor=operator_user)
    assert approved.state == ReservationState.APPROVED
    assert approved.approved_by == operator_user
    entry = LogEntry.objects.get(object_id=str(new.pk))
    assert entry.user == operator_user and "Approved" in entry.change_message


def test_back_to_back_reservations_do_not_overlap(pool, operator_user: User) -> None:
    reserve(pool, "alpha", 16, days_ahead(1), days_ahead(5))
    new = reserve(pool, "beta", 16, days_ahead(5), days_ahead(9), state=ReservationState.REQUESTED)
    assert reservations.approve(new, actor=operator_user).state == ReservationState.APPROVED


def test_an_order_landing_mid_window_ends_the_conflict_on_its_promised_date(pool, operator_user: User) -> None:
    ProcurementOrder.objects.create(
        pool=pool, count=8, ordered_on=days_ahead(-200).date(), promised_on=days_ahead(4).date()
    )
    reserve(pool, "alpha", 12, days_ahead(1), days_ahead(10))
    new = reserve(pool, "beta", 8, days_ahead(2), days_ahead(10), state=ReservationState.REQUESTED)
    with pytest.raises(ConflictError) as exc:
        reservations.approve(new, actor=operator_user)
    assert exc.value.detail["conflict"]["start"] == days_ahead(2).isoformat()
    assert exc.value.detail["conflict"]["end"] == days_ahead(4).isoformat()
    later = reserve(pool, "beta", 8, days_ahead(4), days_ahead(10), state=ReservationState.REQUESTED)
    assert reservations.approve(later, actor=operator_user).state == ReservationState.APPROVED


def test_a_late_order_counts_for_nothing(pool, operator_user: User) -> None:
    ProcurementOrder.objects.create(
        pool=pool, count=8, ordered_on=days_ahead(-300).date(), promised_on=days_ahead(-3).date()
    )
    new = reserve(pool, "beta", 20, days_ahead(2), days_ahead(4), state=ReservationState.REQUESTED)
    with pytest.raises(ConflictError):
        reservations.approve(new, actor=operator_user)


def test_only_energised_gpus_count_for_supply(site_a: Site, operator_user: User) -> None:
    # 8 x 700 W + 2000 W overhead = 7.6 kW a node: a 16 kW rack runs two of its three nodes.
    rack = Rack.objects.create(site=site_a, name="r1", power_budget_kw=16)
    add_nodes(site_a, 3, rack=rack)
    pool = make_pool(site_a)
    figures = supply.pool_figures([pool])[pool.pk]
    assert (figures.installed, figures.energised, figures.healthy) == (24, 16, 16)
    new = reserve(pool, "alpha", 17, days_ahead(1), days_ahead(2), state=ReservationState.REQUESTED)
    with pytest.raises(ConflictError):
        reservations.approve(new, actor=operator_user)


def test_preemptible_reservations_are_refused_beyond_installed_gpus(site_a: Site, operator_user: User) -> None:
    # 24 installed, 16 energised (the rack's budget runs two of three nodes); 16 firm held.
    rack = Rack.objects.create(site=site_a, name="r1", power_budget_kw=16)
    add_nodes(site_a, 3, rack=rack)
    pool = make_pool(site_a)
    reserve(pool, "alpha", 16, days_ahead(1), days_ahead(5))
    over = reserve(
        pool, "spot", 9, days_ahead(1), days_ahead(5), tier=PriorityTier.PREEMPTIBLE, state=ReservationState.REQUESTED
    )
    with pytest.raises(ConflictError) as exc:
        reservations.approve(over, actor=operator_user)
    assert exc.value.detail["conflict"]["demand"] == 25 and exc.value.detail["conflict"]["supply"] == 24
    assert "installed" in exc.value.detail["detail"]
    # Up to installed they fit, beyond energised supply: the first preempted if supply falls short...
    new = reserve(
        pool, "spot", 8, days_ahead(1), days_ahead(5), tier=PriorityTier.PREEMPTIBLE, state=ReservationState.REQUESTED
    )
    assert reservations.approve(new, actor=operator_user).state == ReservationState.APPROVED
    # ...and they take nothing from firm reservations.
    firm = reserve(pool, "beta", 1, days_ahead(5), days_ahead(6), state=ReservationState.REQUESTED)
    assert reservations.approve(firm, actor=operator_user).state == ReservationState.APPROVED


def test_an_approved_reservation_cannot_be_approved_again(pool, operator_user: User) -> None:
    r = reserve(pool, "alpha", 1, days_ahead(1), days_ahead(2), state=ReservationState.REQUESTED)
    reservations.approve(r, actor=operator_user)
    with pytest.raises(ConflictError, match="approved"):
        reservations.approve(r, actor=operator_user)


# --- quotas -------------------------------------------------------------------------------------------


@pytest.fixture
def big_pool(site_a: Site):  # 32 GPUs: quota, not supply, is the limit
    add_nodes(site_a, 4)
    pool = make_pool(site_a)
    quota(pool, "alpha", 8, 4)
    quota(pool, "beta", 8, 0)
    return pool


def test_borrowing_inside_the_limit_is_accepted(big_pool, operator_user: User) -> None:
    new = reserve(big_pool, "alpha", 12, days_ahead(1), days_ahead(5), state=ReservationState.REQUESTED)
    assert reservations.approve(new, actor=operator_user).state == ReservationState.APPROVED


def test_borrowing_beyond_the_limit_is_refused_naming_gpus(big_pool, operator_user: User) -> None:
    reserve(big_pool, "alpha", 8, days_ahead(1), days_ahead(5))
    new = reserve(big_pool, "alpha", 5, days_ahead(3), days_ahead(4), state=ReservationState.REQUESTED)
    with pytest.raises(ConflictError) as exc:
        reservations.approve(new, actor=operator_user)
    # Kueue: 8 held + 5 asked is over nominal 8 + borrowingLimit 4; 4 more would fit.
    assert "at most 4 more GPUs" in exc.value.detail["gpus"] and "borrowing limit 4" in exc.value.detail["gpus"]
    assert exc.value.detail["fits"] == 4
    assert Reservation.objects.get(pk=new.pk).state == ReservationState.REQUESTED


def test_borrowing_more_than_the_others_leave_unused_is_refused(big_pool, operator_user: User) -> None:
    reserve(big_pool, "beta", 6, days_ahead(2), days_ahead(3))  # beta leaves 2 of its 8 unused then
    new = reserve(big_pool, "alpha", 12, days_ahead(1), days_ahead(5), state=ReservationState.REQUESTED)
    with pytest.raises(ConflictError) as exc:
        reservations.approve(new, actor=operator_user)
    # alpha may hold its own 8 plus the 2 beta leaves unused: 10, not 12.
    assert "at most 10 more GPUs" in exc.value.detail["gpus"] and "others' unused 2" in exc.value.detail["gpus"]
    assert days_ahead(1).isoformat() in exc.value.detail["gpus"] and exc.value.detail["fits"] == 10


def test_a_team_without_quota_on_a_pool_with_quotas_is_refused(big_pool, operator_user: User) -> None:
    new = reserve(big_pool, "gamma", 1, days_ahead(1), days_ahead(2), state=ReservationState.REQUESTED)
    with pytest.raises(ConflictError) as exc:
        reservations.approve(new, actor=operator_user)
    assert "gpus" in exc.value.detail


# --- the beat task ------------------------------------------------------------------------------------


def test_advance_states_moves_reservations_through_their_window(pool) -> None:
    now = days_ahead(0) + timedelta(hours=12)
    starting = reserve(pool, "alpha", 1, now - timedelta(hours=1), now + timedelta(hours=1))
    ending = reserve(pool, "beta", 1, now - timedelta(hours=3), now - timedelta(hours=2), state=ReservationState.ACTIVE)
    future = reserve(pool, "gamma", 1, now + timedelta(hours=1), now + timedelta(hours=2))
    lapsed = reserve(pool, "delta", 1, now - timedelta(hours=3), now - timedelta(hours=1), state="requested")
    assert reservations.advance_states(now) == {"activated": 1, "expired": 1, "lapsed": 1}
    states = {r.pk: r.state for r in Reservation.objects.all()}
    assert states == {starting.pk: "active", ending.pk: "expired", future.pk: "approved", lapsed.pk: "cancelled"}
    assert reservations.advance_states(now) == {"activated": 0, "expired": 0, "lapsed": 0}
