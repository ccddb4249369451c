"""Compliance records are evidence: an API that silently dropped part of a write would record less
than the officer sent and answer 200. Every compliance serializer refuses a body that names a field
it does not take (a typo, a field of another version of the API) or one only the server sets, with
a 400 naming each such field, and writes nothing.
"""

from __future__ import annotations

from typing import Any

from rest_framework import serializers

UNKNOWN = "Unknown field: nothing was written (the fields this endpoint takes are in its OpenAPI schema)."
READ_ONLY = "Read-only: the server sets it."


class KnownFieldsOnly:
    """A serializer mixin (before ``serializers.Serializer`` in the bases). ``read_only_hints`` may
    say, per read-only field, where its value comes from."""

    read_only_hints: dict[str, str] = {}

    def to_internal_value(self, data: Any) -> Any:
        if hasattr(data, "keys"):
            fields = self.fields  # type: ignore[attr-defined]
            errors = {}
            for name in sorted(map(str, data.keys())):
                if name not in fields:
                    errors[name] = [UNKNOWN]
                elif fields[name].read_only:
                    errors[name] = [self.read_only_hints.get(name, READ_ONLY)]
            if errors:
                raise serializers.ValidationError(errors)
        return super().to_internal_value(data)  # type: ignore[misc]
