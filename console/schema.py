"""OpenAPI descriptions for the console's own authentication classes, and the answer shapes the
read APIs share."""

from drf_spectacular.extensions import OpenApiAuthenticationExtension
from rest_framework import serializers


class AgentTokenScheme(OpenApiAuthenticationExtension):
    target_class = "console.authentication.AgentTokenAuthentication"
    name = "agentToken"

    def get_security_definition(self, auto_schema):  # type: ignore[no-untyped-def]
        return {
            "type": "http",
            "scheme": "bearer",
            "description": "Agent token from `manage.py create_agent_token --site NAME`, scoped to one site.",
        }


class PersonalTokenScheme(OpenApiAuthenticationExtension):
    target_class = "console.authentication.PersonalTokenAuthentication"
    name = "personalToken"

    def get_security_definition(self, auto_schema):  # type: ignore[no-untyped-def]
        return {
            "type": "http",
            "scheme": "bearer",
            "description": "Personal API token from /accounts/tokens/: acts as its user, with that user's role.",
        }


class AgentOrPersonalTokenScheme(OpenApiAuthenticationExtension):
    target_class = "console.authentication.AgentOrPersonalTokenAuthentication"
    name = "agentOrPersonalToken"

    def get_security_definition(self, auto_schema):  # type: ignore[no-untyped-def]
        return {
            "type": "http",
            "scheme": "bearer",
            "description": "An agent token of the job's site (a training client), or a personal API token "
            "acting with its user's role.",
        }


# --- answer shapes the read APIs share ------------------------------------------------------------


class CustomWindowSerializer(serializers.Serializer):
    """An answer that says which window it covers (console.ranges.Window.as_json): ``range`` (a
    preset's name, or "custom") and its two ends. ``from`` and ``to`` are Python keywords, hence
    declared in get_fields."""

    range = serializers.CharField(help_text='the preset read, or "custom" for from / to')

    def get_fields(self) -> dict[str, serializers.Field]:
        fields = super().get_fields()
        fields["from"] = serializers.DateTimeField(required=self.window_always_said, help_text="the window's start")
        fields["to"] = serializers.DateTimeField(required=self.window_always_said, help_text="the window's end")
        return fields

    window_always_said = True


class CustomWindowAnswerSerializer(CustomWindowSerializer):
    """A page snapshot that names its window's ends only when from / to were asked for (the
    ``range`` of a preset answer is the preset's name)."""

    window_always_said = False
