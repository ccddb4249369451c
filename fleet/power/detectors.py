"""Power detectors: functions from the per-minute group rollups (fleet.power.read.minute_draws)
to the findings present now, registered with the incident engine like the GPU, training and
serving detectors.

* power-rack-over-budget: a rack's draw (its GPUs' power plus node overhead) above its budget in
  its latest minute, or at >= 95 % of it for N consecutive minutes;
* power-site-near-contract: a site's draw at >= 95 % of its contracted power for N minutes;
* power-rack-capping: most of a rack's GPUs throttled (power or thermal limit, the rollups'
  throttled_gpus) for N consecutive minutes.

Every finding carries the labels site and rack (a site finding: site only). Impact: the kW over
budget or contract and the GPUs affected (``gpus_affected``: power limits slow GPUs, they do not take
them out of service, so no ``gpu_uuids``). Hysteresis: a firing finding holds while the latest
minute stays at >= 90 % of the limit (capping: while a quarter of the GPUs are throttled); a rack
or site without a minute in the last ten is held, not cleared (missing data is not health).
"""

from __future__ import annotations

import itertools
from datetime import datetime, timedelta
from typing import Any

from fleet.inventory.models import Rack, Site
from fleet.power import read as power
from incidents.choices import Severity
from incidents.detectors import FindingSpec, detector, firing_since

MINUTE = timedelta(minutes=1)
SUSTAIN_MINUTES = 5  # N
NEAR = 0.95  # of the budget or contract, for N minutes
HOLD = 0.90  # a firing finding clears under this
CAPPED_SHARE = 0.5  # "most" of a rack's GPUs throttled
CAPPED_HOLD = 0.25
ACTIVE_WITHIN = timedelta(minutes=10)
LATEST_WITHIN = timedelta(minutes=3)  # the newest minute must be this recent to fire


def _recent(now: datetime) -> dict[tuple[str, int], list[dict[str, Any]]]:
    """The complete minutes of the last ACTIVE_WITHIN (the minute now is in is still filling)."""
    end = now.replace(second=0, microsecond=0)
    return power.minute_draws(end - ACTIVE_WITHIN, end)


def _tail(minutes: list[dict[str, Any]], now: datetime, length: int) -> list[dict[str, Any]] | None:
    """The last ``length`` minutes if consecutive and the newest is recent; None otherwise."""
    if len(minutes) < length or now - minutes[-1]["bucket"] > LATEST_WITHIN:
        return None
    tail = minutes[-length:]
    if any(b["bucket"] - a["bucket"] != MINUTE for a, b in itertools.pairwise(tail)):
        return None
    return tail


def _over(
    minutes: list[dict[str, Any]], now: datetime, limit_w: float, *, was_firing: bool, instant: bool
) -> dict[str, Any] | None:
    """Whether draw is over ``limit_w`` in the newest minute (with ``instant``) or at >= NEAR of it
    for SUSTAIN_MINUTES; a firing one holds while the newest minute is >= HOLD of it."""
    if not minutes or now - minutes[-1]["bucket"] > LATEST_WITHIN or limit_w <= 0:
        return None
    latest = minutes[-1]
    tail = _tail(minutes, now, SUSTAIN_MINUTES)
    fires = (instant and latest["draw_w"] > limit_w) or (
        tail is not None and all(m["draw_w"] >= NEAR * limit_w for m in tail)
    )
    if not fires and not (was_firing and latest["draw_w"] >= HOLD * limit_w):
        return None
    # The episode began at the first of the consecutive minutes at or above the hold line.
    start = len(minutes) - 1
    while start > 0 and minutes[start - 1]["draw_w"] >= HOLD * limit_w:
        start -= 1
    return {"latest": latest, "started_at": minutes[start]["bucket"]}


def _rack_labels(rack: Rack) -> dict[str, str]:
    return {"site": rack.site.name, "rack": rack.name, "rack_id": str(rack.pk)}


def _judged_rack(now: datetime, labels: dict[str, Any]) -> bool:
    rack_id = labels.get("rack_id")
    return rack_id is None or ("rack", int(rack_id)) in _recent(now)


def _judged_site(now: datetime, labels: dict[str, Any]) -> bool:
    site = Site.objects.filter(name=labels.get("site", "")).first()
    return site is None or ("site", site.pk) in _recent(now)


@detector("power-rack-over-budget", judged=_judged_rack)
def power_rack_over_budget(now: datetime) -> list[FindingSpec]:
    """A rack drawing more than its budget, or >= 95 % of it for N minutes (see ``_over``)."""
    recent = _recent(now)
    already = firing_since("power-rack-over-budget")
    specs = []
    for rack in Rack.objects.select_related("site").filter(power_budget_kw__isnull=False).order_by("pk"):
        fingerprint = f"power-rack-over-budget:{rack.pk}"
        budget_w = float(rack.power_budget_kw) * 1000
        found = _over(recent.get(("rack", rack.pk), []), now, budget_w, was_firing=fingerprint in already, instant=True)
        if found is None:
            continue
        draw = found["latest"]["draw_w"]
        over = draw > budget_w
        specs.append(
            FindingSpec(
                fingerprint=fingerprint,
                labels=_rack_labels(rack),
                severity=Severity.SEV2 if over else Severity.SEV3,
                summary=(
                    f"Rack {rack.name} at {rack.site.name} draws {draw / 1000:.1f} kW, "
                    f"{100 * draw / budget_w:.0f} % of its {budget_w / 1000:.1f} kW budget"
                ),
                description=(
                    "The rack's GPUs plus node overhead draw at or above its power budget. Past it the "
                    "PDU or breaker trips and takes the whole rack down. Cap GPU power (nvidia-smi -pl), "
                    "move work off the rack, or raise the budget if the feed allows it."
                ),
                impact={
                    "draw_kw": round(draw / 1000, 2),
                    "budget_kw": round(budget_w / 1000, 1),
                    "kw_over_budget": round(max(0.0, draw - budget_w) / 1000, 2),
                    "utilisation_pct": round(100 * draw / budget_w, 1),
                    "gpus_affected": found["latest"]["gpus"],
                },
                category="power",
                started_at=already.get(fingerprint) or found["started_at"],
            )
        )
    return specs


@detector("power-site-near-contract", judged=_judged_site)
def power_site_near_contract(now: datetime) -> list[FindingSpec]:
    """A site drawing >= 95 % of its contracted power for N minutes (or over it)."""
    recent = _recent(now)
    already = firing_since("power-site-near-contract")
    specs = []
    for site in Site.objects.filter(contracted_power_kw__isnull=False).order_by("pk"):
        fingerprint = f"power-site-near-contract:{site.pk}"
        contracted_w = float(site.contracted_power_kw) * 1000
        found = _over(
            recent.get(("site", site.pk), []), now, contracted_w, was_firing=fingerprint in already, instant=False
        )
        if found is None:
            continue
        draw = found["latest"]["draw_w"]
        specs.append(
            FindingSpec(
                fingerprint=fingerprint,
                labels={"site": site.name},
                severity=Severity.SEV2 if draw > contracted_w else Severity.SEV3,
                summary=(
                    f"Site {site.name} draws {draw / 1000:.1f} kW, {100 * draw / contracted_w:.0f} % of its "
                    f"{contracted_w / 1000:.1f} kW contracted power"
                ),
                description=(
                    "The site is near the grid power it contracted for; past it the utility charges "
                    "penalties or the feed trips. Shed or cap load, or defer new work at this site."
                ),
                impact={
                    "draw_kw": round(draw / 1000, 2),
                    "contracted_kw": round(contracted_w / 1000, 1),
                    "kw_over_contract": round(max(0.0, draw - contracted_w) / 1000, 2),
                    "utilisation_pct": round(100 * draw / contracted_w, 1),
                    "gpus_affected": found["latest"]["gpus"],
                },
                category="power",
                started_at=already.get(fingerprint) or found["started_at"],
            )
        )
    return specs


@detector("power-rack-capping", judged=_judged_rack)
def power_rack_capping(now: datetime) -> list[FindingSpec]:
    """Most of a rack's GPUs throttled for N consecutive minutes; a firing one holds while a
    quarter of them still are."""
    recent = _recent(now)
    already = firing_since("power-rack-capping")
    specs = []
    for rack in Rack.objects.select_related("site").order_by("pk"):
        fingerprint = f"power-rack-capping:{rack.pk}"
        minutes = recent.get(("rack", rack.pk), [])
        tail = _tail(minutes, now, SUSTAIN_MINUTES)

        def share(m: dict[str, Any]) -> float:
            return (m["throttled_gpus"] or 0) / m["gpus"] if m["gpus"] else 0.0

        fires = tail is not None and all(share(m) >= CAPPED_SHARE for m in tail)
        if not fires and not (
            fingerprint in already
            and minutes
            and now - minutes[-1]["bucket"] <= LATEST_WITHIN
            and share(minutes[-1]) >= CAPPED_HOLD
        ):
            continue
        latest = minutes[-1]
        start = len(minutes) - 1
        while start > 0 and share(minutes[start - 1]) >= CAPPED_HOLD:
            start -= 1
        specs.append(
            FindingSpec(
                fingerprint=fingerprint,
                labels=_rack_labels(rack),
                severity=Severity.SEV3,
                summary=(
                    f"Power capping across rack {rack.name} at {rack.site.name}: {latest['throttled_gpus']} of "
                    f"{latest['gpus']} GPUs throttled for {SUSTAIN_MINUTES}+ min"
                ),
                description=(
                    "Most of the rack's GPUs run slowed by a power (or thermal) limit: the rack is fed or "
                    "cooled below what its load needs, and every job on it runs slower. Check the rack's "
                    "power cap settings, PDU limits and cooling."
                ),
                impact={
                    "gpus_affected": latest["throttled_gpus"],
                    "gpus": latest["gpus"],
                    "throttled_share": round(share(latest), 3),
                    "draw_kw": round(latest["draw_w"] / 1000, 2),
                    "budget_kw": float(rack.power_budget_kw) if rack.power_budget_kw is not None else None,
                },
                category="power",
                started_at=already.get(fingerprint) or minutes[start]["bucket"],
            )
        )
    return specs
