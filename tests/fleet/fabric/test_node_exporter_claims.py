"""node_exporter's series naming another site's host (item 9b for fabric and storage): the first
sighting is a claim recorded as the GPU samples' are (fleet.inventory.claims), once a push, shown
on the fleet page and in the admin; nothing is stored for that host, the push's other hosts are
stored, and once an Admin moves the node to the claimant its series flow.

The door says so (issue 37, item 10: it answered 202 whatever it held back): 409 when every series
of the push was another site's host's (403 once an Admin kept the node there), as the GPU doors
answer for another site's GPUs; 202 naming the held-back hosts when the rest was accepted."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest
from django.contrib.auth.models import User

from fleet.inventory import claims
from fleet.models import ClaimConflict, DiskSample, MountSample, Node, PortSample, Site
from tests.fleet.fabric.node_exporter import exposition, push
from tests.fleet.telemetry.test_prometheus_remote_write import send, write_request

pytestmark = pytest.mark.django_db

THEIRS = "gpu-a-017"  # registered under site A
OURS = "gpu-b-001"  # new, from site B's token
ADMIN_LIST = "/admin/fleet/claimconflict/"


def _lines(host: str, value: int) -> list[str]:
    return [
        f'node_infiniband_link_downed_total{{device="mlx5_0",port="1",hostname="{host}"}} {value}',
        f'node_filesystem_avail_bytes{{device="/dev/md0",mountpoint="/s",fstype="xfs",hostname="{host}"}} {value}',
        f'node_disk_read_bytes_total{{device="nvme0n1",hostname="{host}"}} {value}',
    ]


def _ts_ms(minute: int) -> int:
    return int((datetime.now(UTC).replace(second=0, microsecond=0).timestamp() - 60 * (10 - minute)) * 1000)


def _push_both(client, token: str, minute: int):  # type: ignore[no-untyped-def]
    body = exposition(_lines(THEIRS, 100 + minute) + _lines(OURS, 200 + minute), _ts_ms(minute))
    return push(client, token, body, query="")


def _push_theirs(client, token: str, minute: int):  # type: ignore[no-untyped-def]
    return push(client, token, exposition(_lines(THEIRS, 100 + minute), _ts_ms(minute)), query="")


def _held_hosts(response) -> list[tuple[str, str, str]]:  # type: ignore[no-untyped-def]
    return [(h["field"], h["value"], h["state"]) for h in response.json()["held_back"]]


@pytest.fixture
def theirs(site_a: Site) -> Node:
    return Node.objects.create(site=site_a, hostname=THEIRS)


def _stored(host: str) -> tuple[int, int, int]:
    return (
        PortSample.objects.filter(interface__node__hostname=host).count(),
        MountSample.objects.filter(mount__node__hostname=host).count(),
        DiskSample.objects.filter(node__hostname=host).count(),
    )


def test_another_sites_host_is_a_claim_its_series_held_back_and_the_other_hosts_stored(
    client, token_b, site_a, site_b, theirs
) -> None:
    response = _push_both(client, token_b, 1)
    assert response.status_code == 202, response.content
    assert _held_hosts(response) == [("hostname", THEIRS, "pending")]  # the held-back host, named
    assert response.json()["node_samples"] == 3 and response.json()["batch"]  # OURS's three series
    claim = ClaimConflict.objects.get()
    assert (claim.kind, claim.value, claim.owner_site, claim.claimant_site) == ("hostname", THEIRS, site_a, site_b)
    assert claim.count == 1 and claim.resolution == ""  # once for the push, not once per table
    assert _stored(THEIRS) == (0, 0, 0)
    assert _stored(OURS) == (1, 1, 1)
    assert Node.objects.get(hostname=OURS).site == site_b
    theirs.refresh_from_db()
    assert theirs.site == site_a and not theirs.interfaces.exists()  # nothing registered on it

    assert _push_both(client, token_b, 2).status_code == 202
    claim.refresh_from_db()
    assert claim.count == 2 and ClaimConflict.objects.count() == 1
    assert _stored(THEIRS) == (0, 0, 0) and _stored(OURS) == (2, 2, 2)


def test_the_owner_keeps_writing_its_hosts_series(client, token_a, token_b, theirs) -> None:
    body = exposition(_lines(THEIRS, 5), int(datetime.now(UTC).timestamp() * 1000) - 120_000)
    assert push(client, token_a, body, query="").status_code == 202
    assert _stored(THEIRS) == (1, 1, 1) and not ClaimConflict.objects.exists()


def test_the_claim_shows_on_the_fleet_page_and_in_the_admin_and_moving_it_lets_the_series_flow(
    client, token_b, site_b, theirs, viewer_client, admin_client
) -> None:
    _push_both(client, token_b, 1)
    page = viewer_client.get("/fleet/").content.decode()
    assert 'id="claim-conflicts"' in page and "1 claim of a GPU or node" in page
    claim = ClaimConflict.objects.get()
    assert THEIRS in admin_client.get(f"{ADMIN_LIST}?resolution__exact=").content.decode()
    moved = admin_client.post(ADMIN_LIST, {"action": "move_to_claimant", "_selected_action": [claim.pk]}, follow=True)
    assert "1 claim(s) resolved" in moved.content.decode()
    theirs.refresh_from_db()
    assert theirs.site == site_b
    _push_both(client, token_b, 3)
    assert _stored(THEIRS) == (1, 1, 1) and ClaimConflict.objects.pending().count() == 0


def test_a_push_of_only_another_sites_host_is_a_409_naming_it_and_stores_nothing(
    client, token_b, site_a, site_b, theirs
) -> None:
    response = _push_theirs(client, token_b, 1)
    assert response.status_code == 409, response.content
    body = response.json()
    assert body["field"] == "hostname" and THEIRS in body["error"] and "pending" in body["error"]
    assert _held_hosts(response) == [("hostname", THEIRS, "pending")]
    assert (body["node_samples"], body["batch"]) == (0, None)
    assert _stored(THEIRS) == (0, 0, 0)
    claim = ClaimConflict.objects.get()
    assert (claim.value, claim.claimant_site, claim.count) == (THEIRS, site_b, 1)  # once, at the door


def test_once_an_admin_keeps_the_host_with_its_owner_the_push_is_a_403(
    client, token_b, site_a, theirs, admin_user: User
) -> None:
    _push_theirs(client, token_b, 1)
    claims.resolve(ClaimConflict.objects.get(), resolution="kept", actor=admin_user)
    response = _push_theirs(client, token_b, 2)
    assert response.status_code == 403, response.content
    assert _held_hosts(response) == [("hostname", THEIRS, "kept")]
    # Partly another site's: still 202, the kept host named.
    response = _push_both(client, token_b, 3)
    assert response.status_code == 202 and _held_hosts(response) == [("hostname", THEIRS, "kept")]
    assert _stored(THEIRS) == (0, 0, 0) and _stored(OURS) == (1, 1, 1)


def test_remote_write_answers_as_the_text_door_one_sighting_for_all_its_timestamps(
    client, token_b, site_a, site_b, theirs
) -> None:
    stamps = [_ts_ms(minute) for minute in (1, 2, 3)]
    theirs_only = "\n".join(_lines(THEIRS, 7))
    response = send(client, token_b, write_request(theirs_only, *stamps))
    assert response.status_code == 409, response.content
    assert _held_hosts(response) == [("hostname", THEIRS, "pending")]
    assert ClaimConflict.objects.get().count == 1  # three timestamps, one request: one sighting

    both = "\n".join(_lines(THEIRS, 8) + _lines(OURS, 9))
    response = send(client, token_b, write_request(both, *stamps))
    assert response.status_code == 202, response.content
    assert _held_hosts(response) == [("hostname", THEIRS, "pending")] and response.json()["batch"]
    assert ClaimConflict.objects.get().count == 2
    assert _stored(THEIRS) == (0, 0, 0) and _stored(OURS) == (3, 3, 3)
