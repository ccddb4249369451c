"""The site's power rule (power_budget.site_power_steps), pure: whole nodes curtailed in the site's
power order, approved power restoring them before it energises arrivals, arrivals in arrival order,
and nothing running ever switched off."""

from __future__ import annotations

from datetime import date

from fleet.capacity.power_budget import Arrival, SiteNode, site_power_steps

TODAY = date(2027, 1, 15)
FEB, APR = date(2027, 2, 1), date(2027, 4, 1)
H200, L40S = 1, 2  # pool ids, in power order

# 8 GPUs a node, 2,000 W of node overhead: an H200 node 8 x 700 + 2000 = 7.6 kW (950 W a GPU),
# an L40S node 8 x 350 + 2000 = 4.8 kW.
HAND_NODES = [SiteNode(7600.0, {H200: 8}), SiteNode(7600.0, {H200: 8}), SiteNode(4800.0, {L40S: 8})]


def test_a_site_short_of_power_curtails_whole_nodes_of_the_later_pool() -> None:
    [now] = site_power_steps(contract_w=16000.0, today=TODAY, nodes=HAND_NODES, pools=[H200, L40S])
    assert now.energised == {H200: 16}
    assert (now.dark_gpus, now.dark_nodes, now.waiting) == ({L40S: 8}, {L40S: 1}, {})
    assert (now.used_w, now.full_load_w) == (15200.0, 20000.0)
    assert now.nodes_on == (True, True, False)
    assert (now.curtailed(H200), now.curtailed(L40S)) == (0, 8)


def test_a_node_that_does_not_fit_stays_dark_and_the_next_one_is_tried() -> None:
    nodes = [SiteNode(5000.0, {1: 4}), SiteNode(6000.0, {2: 4}), SiteNode(5000.0, {3: 4})]
    [now] = site_power_steps(contract_w=10000.0, today=TODAY, nodes=nodes, pools=[1, 2, 3])
    assert now.energised == {1: 4, 3: 4} and now.dark_gpus == {2: 4}


def test_approved_power_restores_the_curtailed_nodes_before_it_energises_arrivals() -> None:
    """The issue's hand check: 16 kW, 16 H200 and 8 L40S, 8 H200 landing in February, +8 kW from
    April: from April all 24 installed GPUs run and 4 of the 8 new H200 (950 W each) are energised."""
    _now, feb, apr = site_power_steps(
        contract_w=16000.0,
        today=TODAY,
        nodes=HAND_NODES,
        arrivals=[Arrival(FEB, H200, 8, 950.0)],
        approvals=[(APR, 8000.0)],
        pools=[H200, L40S],
    )
    assert (feb.day, feb.energised, feb.waiting, feb.dark_gpus) == (FEB, {H200: 16}, {H200: 8}, {L40S: 8})
    assert apr.day == APR and apr.power_w == 24000.0
    assert apr.energised == {H200: 16 + 4, L40S: 8}
    assert (apr.dark_gpus, apr.waiting) == ({}, {H200: 4})
    assert apr.used_w == 20000.0 + 4 * 950.0


def test_power_and_gpus_landing_on_one_day_restore_before_they_energise() -> None:
    _now, apr = site_power_steps(
        contract_w=16000.0,
        today=TODAY,
        nodes=HAND_NODES,
        arrivals=[Arrival(APR, H200, 8, 950.0)],
        approvals=[(APR, 8000.0)],
        pools=[H200, L40S],
    )
    assert apr.energised == {H200: 20, L40S: 8} and apr.waiting == {H200: 4}


def test_arrivals_are_energised_in_arrival_order_gpu_by_gpu_across_pools() -> None:
    # 5 kW spare: pool 2's 4 GPUs (1 kW each) land first and all run; pool 1's land later and get
    # the 1 kW left: one GPU of 950 W.
    nodes = [SiteNode(5000.0, {1: 4})]
    _now, d1, d2 = site_power_steps(
        contract_w=10000.0,
        today=TODAY,
        nodes=nodes,
        arrivals=[Arrival(APR, 1, 4, 950.0), Arrival(FEB, 2, 4, 1000.0)],
        pools=[1, 2],
    )
    assert (d1.day, d1.energised) == (FEB, {1: 4, 2: 4})
    assert (d2.day, d2.energised, d2.waiting) == (APR, {1: 5, 2: 4}, {1: 3})


def test_more_power_never_switches_off_a_node_that_runs() -> None:
    """First fit over all nodes again with 11 kW would run nodes 1 and 2 and drop node 3: the plan
    adds power to what runs instead, so node 2 waits until its 6 kW fits."""
    nodes = [SiteNode(5000.0, {1: 4}), SiteNode(6000.0, {2: 4}), SiteNode(5000.0, {3: 4})]
    now, feb, apr = site_power_steps(
        contract_w=10000.0, today=TODAY, nodes=nodes, approvals=[(FEB, 1000.0), (APR, 5000.0)], pools=[1, 2, 3]
    )
    assert now.energised == feb.energised == {1: 4, 3: 4}
    assert apr.energised == {1: 4, 2: 4, 3: 4} and apr.dark_gpus == {}


def test_an_approval_due_by_today_counts_today_and_a_late_arrival_lands_today() -> None:
    now, today = site_power_steps(
        contract_w=16000.0,
        today=TODAY,
        nodes=HAND_NODES,
        arrivals=[Arrival(date(2027, 1, 2), H200, 8, 950.0)],
        approvals=[(date(2026, 12, 1), 8000.0)],
        pools=[H200, L40S],
    )
    assert now.energised == {H200: 16, L40S: 8} and now.power_w == 24000.0
    assert (today.day, today.energised[H200]) == (TODAY, 20)


def test_a_site_without_contracted_power_runs_every_node_and_every_arrival() -> None:
    now, feb = site_power_steps(
        contract_w=None, today=TODAY, nodes=HAND_NODES, arrivals=[Arrival(FEB, H200, 8, 950.0)], pools=[H200, L40S]
    )
    assert now.energised == {H200: 16, L40S: 8} and feb.energised == {H200: 24, L40S: 8}
    assert feb.curtailed(H200) == feb.curtailed(L40S) == 0 and feb.why(L40S) is None


def test_why_says_what_is_dark_and_the_power_in_figures() -> None:
    now, _feb, apr = site_power_steps(
        contract_w=16000.0,
        today=TODAY,
        nodes=HAND_NODES,
        arrivals=[Arrival(FEB, H200, 8, 950.0)],
        approvals=[(APR, 8000.0)],
        pools=[H200, L40S],
    )
    assert now.why(H200) is None
    assert now.why(L40S) == (
        "8 installed GPUs curtailed (1 node): site power 16.0 kW (16.0 contracted + 0.0 approved) runs 15.2"
        " of 20.0 kW at full load; pool 2 of 2 in the site's power order"
    )
    assert apr.why(H200) == (
        "4 landed GPUs not energised: site power 24.0 kW (16.0 contracted + 8.0 approved) runs 23.8"
        " of 27.6 kW at full load; pool 1 of 2 in the site's power order"
    )
    assert apr.why(L40S) is None
