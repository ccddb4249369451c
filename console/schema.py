"""OpenAPI descriptions for the console's own authentication classes."""

from drf_spectacular.extensions import OpenApiAuthenticationExtension


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
