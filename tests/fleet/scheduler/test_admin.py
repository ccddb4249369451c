"""A queue's pool is the one thing a person sets: in the admin, by an Admin, audited; the door
creates queues, so the admin cannot add one."""

from __future__ import annotations

from compliance.models import AuditEntry
from fleet.models import Pool, SchedulerQueue
from tests.fleet.scheduler.support import KUEUE, push


def test_an_admin_maps_a_cluster_queue_to_a_pool_audited(
    client, site_a, token_a, admin_client, operator_client
) -> None:
    assert push(client, token_a, KUEUE).status_code == 202
    pool = Pool.objects.create(site=site_a, gpu_model="NVIDIA H100 80GB HBM3", name="H100")
    queue = SchedulerQueue.objects.get(name="team-a-h100")
    url = f"/admin/fleet/schedulerqueue/{queue.pk}/change/"
    refused = operator_client.post(url, {"pool": pool.pk})
    assert refused.status_code == 302 and refused.url.startswith("/admin/login/")
    assert admin_client.post(url, {"pool": pool.pk, "name": "renamed", "cohort": "x"}).status_code == 302
    queue.refresh_from_db()
    assert (queue.pool, queue.name, queue.cohort) == (pool, "team-a-h100", "h100-pool")  # what Kueue reports stays
    entry = AuditEntry.objects.get(model="schedulerqueue", object_id=str(queue.pk), action="update")
    assert entry.actor == "ada" and (entry.before["pool"], entry.after["pool"]) == (None, pool.pk)
    assert admin_client.get("/admin/fleet/schedulerqueue/add/").status_code == 403
