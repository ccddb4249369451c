import django.contrib.postgres.fields
from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [
        ("incidents", "0004_incident_actions"),
    ]

    operations = [
        migrations.AddField(
            model_name="finding",
            name="flap_clears",
            field=django.contrib.postgres.fields.ArrayField(
                base_field=models.DateTimeField(), blank=True, default=list, size=None
            ),
        ),
        migrations.AddField(
            model_name="finding",
            name="flapping_since",
            field=models.DateTimeField(blank=True, null=True),
        ),
    ]
