"""Teams become records (issue 23): quotas and reservations refer to a Team by name, in the same
``team`` column. Every name already used gets its Team row before the foreign keys are added.

Quotas gain Kueue's lendingLimit, and borrowingLimit becomes nullable (empty: no limit); existing
rows keep the figure they had (0 still means "may not borrow"). Pools gain reclaimWithinCohort
(Never, as Kueue's default), reservations the preempted state and its reason."""

import django.db.models.deletion
from django.conf import settings
from django.db import migrations, models


def create_teams(apps, schema_editor):  # type: ignore[no-untyped-def]
    """A Team for every name a quota or reservation already uses."""
    Team = apps.get_model("fleet", "Team")
    TeamQuota = apps.get_model("fleet", "TeamQuota")
    Reservation = apps.get_model("fleet", "Reservation")
    names = set(TeamQuota.objects.values_list("team", flat=True)) | set(
        Reservation.objects.values_list("team", flat=True)
    )
    Team.objects.bulk_create([Team(name=name) for name in sorted(names)], ignore_conflicts=True)


class Migration(migrations.Migration):
    dependencies = [
        ("fleet", "0010_capacity"),
        migrations.swappable_dependency(settings.AUTH_USER_MODEL),
    ]

    operations = [
        migrations.AddField(
            model_name="pool",
            name="reclaim_within_cohort",
            field=models.CharField(
                choices=[
                    ("Never", "Never"),
                    ("LowerPriority", "Lower priority only"),
                    ("Any", "Any borrowing reservation"),
                ],
                default="Never",
                help_text="Kueue's reclaimWithinCohort: may a team take back its nominal quota from borrowers?",
                max_length=16,
            ),
        ),
        migrations.AddField(
            model_name="reservation",
            name="preempted_at",
            field=models.DateTimeField(blank=True, null=True),
        ),
        migrations.AddField(
            model_name="reservation",
            name="preempted_by",
            field=models.ForeignKey(
                blank=True,
                help_text="The reclaiming request",
                null=True,
                on_delete=django.db.models.deletion.SET_NULL,
                related_name="+",
                to="fleet.reservation",
            ),
        ),
        migrations.AddField(
            model_name="reservation",
            name="preempted_reason",
            field=models.TextField(blank=True),
        ),
        migrations.AddField(
            model_name="teamquota",
            name="lending_limit_gpus",
            field=models.PositiveIntegerField(
                blank=True,
                help_text="Kueue's lendingLimit; empty: all of its unused nominal quota may be lent",
                null=True,
            ),
        ),
        migrations.AlterField(
            model_name="reservation",
            name="state",
            field=models.CharField(
                choices=[
                    ("requested", "Requested"),
                    ("approved", "Approved"),
                    ("active", "Active"),
                    ("expired", "Expired"),
                    ("cancelled", "Cancelled"),
                    ("preempted", "Preempted"),
                ],
                db_index=True,
                default="requested",
                max_length=16,
            ),
        ),
        migrations.AlterField(
            model_name="teamquota",
            name="borrowing_limit_gpus",
            field=models.PositiveIntegerField(
                blank=True, help_text="Kueue's borrowingLimit; empty: no limit within the pool", null=True
            ),
        ),
        migrations.CreateModel(
            name="Team",
            fields=[
                ("id", models.BigAutoField(auto_created=True, primary_key=True, serialize=False, verbose_name="ID")),
                ("name", models.CharField(max_length=100, unique=True)),
                ("created_at", models.DateTimeField(auto_now_add=True)),
                ("members", models.ManyToManyField(blank=True, related_name="teams", to=settings.AUTH_USER_MODEL)),
            ],
            options={
                "ordering": ["name"],
            },
        ),
        migrations.RunPython(create_teams, migrations.RunPython.noop),
        migrations.AlterField(
            model_name="reservation",
            name="team",
            field=models.ForeignKey(
                db_column="team",
                on_delete=django.db.models.deletion.PROTECT,
                related_name="reservations",
                to="fleet.team",
                to_field="name",
            ),
        ),
        migrations.AlterField(
            model_name="teamquota",
            name="team",
            field=models.ForeignKey(
                db_column="team",
                on_delete=django.db.models.deletion.PROTECT,
                related_name="quotas",
                to="fleet.team",
                to_field="name",
            ),
        ),
        migrations.AddConstraint(
            model_name="teamquota",
            constraint=models.CheckConstraint(
                condition=models.Q(("lending_limit_gpus__isnull", True))
                | models.Q(("lending_limit_gpus__lte", models.F("nominal_gpus"))),
                name="quota_lending_within_nominal",
            ),
        ),
    ]
