"""Timeline actors may be named in full: "alertmanager (token <name>, site <site>)" needs up to 192
characters. (Widening a varchar rewrites nothing and fires no row trigger.)"""

from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [("incidents", "0002_timeline_append_only")]

    operations = [
        migrations.AlterField(
            model_name="timelineentry",
            name="actor_label",
            field=models.CharField(help_text="Who acted: a username, a detector, alertmanager, system", max_length=200),
        ),
    ]
