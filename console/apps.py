from django.apps import AppConfig
from django.db.models.signals import post_delete, post_migrate, post_save


class ConsoleConfig(AppConfig):
    name = "console"
    verbose_name = "Console"

    def ready(self) -> None:
        import console.checks  # (registers check --deploy on the database role)
        import console.schema  # noqa: F401  (registers the OpenAPI auth extension)
        from console import sockets
        from console.extension_points import discover_plugins
        from console.models import AgentToken, agent_token_saved_or_deleted
        from console.roles import sync_roles_after_migrate

        # Roles are (re)synced after every migrate and flush, so permissions added by later
        # migrations reach the groups without a hand-written data migration each time.
        post_migrate.connect(sync_roles_after_migrate, dispatch_uid="console.sync_roles")
        # Logout and a password change close the user's live websockets (console.sockets).
        sockets.connect_receivers()
        # A token saved or deleted any other way (the admin's change form, a site deleted) also
        # reaches every process's verified-token cache at once (console.models.AgentToken.authenticate).
        post_save.connect(agent_token_saved_or_deleted, sender=AgentToken, dispatch_uid="console.tokens.saved")
        post_delete.connect(agent_token_saved_or_deleted, sender=AgentToken, dispatch_uid="console.tokens.deleted")
        # Every app's and room's plugins.py, once every model is loaded (console.extension_points).
        discover_plugins()
