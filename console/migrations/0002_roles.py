"""Create the four role groups (Viewer, Operator, Compliance officer, Admin) with their permissions."""

from django.db import migrations


def create_roles(apps, schema_editor):
    from django.contrib.auth.management import create_permissions

    from console.roles import sync_roles

    # Permissions are normally made after all migrations (post_migrate); make them now so the
    # groups can hold them on a fresh database.
    for app_config in apps.get_app_configs():
        app_config.models_module = True
        create_permissions(app_config, apps=apps, verbosity=0)
        app_config.models_module = None
    sync_roles(apps)


def remove_roles(apps, schema_editor):
    from console.roles import ROLE_PERMISSIONS

    apps.get_model("auth", "Group").objects.filter(name__in=list(ROLE_PERMISSIONS)).delete()


class Migration(migrations.Migration):
    dependencies = [
        ("console", "0001_initial"),
        ("fleet", "0001_initial"),
        ("auth", "0012_alter_user_first_name_max_length"),
        ("contenttypes", "0002_remove_content_type_name"),
    ]

    operations = [migrations.RunPython(create_roles, remove_roles)]
