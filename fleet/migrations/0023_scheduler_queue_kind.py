"""SchedulerQueue.kind: Kueue LocalQueues and Slurm accounts are registered beside ClusterQueues,
partitions and namespaces (an account may share a partition's name, so the kind is part of the
key); a LocalQueue's name is namespace/name."""

from django.db import migrations, models


def fill_kind(apps, schema_editor):  # type: ignore[no-untyped-def]
    SchedulerQueue = apps.get_model("fleet", "SchedulerQueue")
    SchedulerQueue.objects.filter(scheduler="slurm").update(kind="partition")
    SchedulerQueue.objects.filter(scheduler="kubernetes").update(kind="namespace")
    SchedulerQueue.objects.filter(name="").update(kind="cluster")


class Migration(migrations.Migration):
    dependencies = [("fleet", "0022_rejected_by")]

    operations = [
        migrations.AddField(
            model_name="schedulerqueue",
            name="kind",
            field=models.CharField(
                choices=[
                    ("cluster", "Cluster"),
                    ("clusterqueue", "ClusterQueue"),
                    ("localqueue", "LocalQueue"),
                    ("partition", "Partition"),
                    ("account", "Account"),
                    ("namespace", "Namespace"),
                ],
                default="clusterqueue",
                help_text="ClusterQueue, LocalQueue, partition, account, namespace, or the cluster's own series",
                max_length=16,
            ),
            preserve_default=False,
        ),
        migrations.AlterField(
            model_name="schedulerqueue",
            name="name",
            field=models.CharField(
                blank=True,
                help_text="The ClusterQueue, partition, account or namespace; a LocalQueue as namespace/name; "
                "blank: the cluster's own series (nodes, GPUs)",
                max_length=317,
            ),
        ),
        migrations.AlterModelOptions(
            name="schedulerqueue",
            options={"ordering": ["site__name", "scheduler", "kind", "name"]},
        ),
        migrations.RemoveConstraint(model_name="schedulerqueue", name="scheduler_queue_unique_per_site"),
        migrations.AddConstraint(
            model_name="schedulerqueue",
            constraint=models.UniqueConstraint(
                fields=("site", "scheduler", "kind", "name"), name="scheduler_queue_unique_per_site"
            ),
        ),
        # Last: an UPDATE leaves trigger events (the audit log's, the deferred foreign keys') that
        # no ALTER TABLE may follow in the same transaction.
        migrations.RunPython(fill_kind, migrations.RunPython.noop),
    ]
