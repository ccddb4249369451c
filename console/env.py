"""Typed helpers for reading settings from the environment.

Every helper fails loudly: a bad value stops start-up with a message that names the variable,
instead of quietly falling back to a default the operator did not ask for.
"""

from __future__ import annotations

import math
import os
from pathlib import Path


class ImproperlyConfiguredEnv(Exception):
    """Raised when an environment variable holds a value we cannot use."""


_TRUE = {"1", "true", "yes", "on"}
_FALSE = {"0", "false", "no", "off"}


def env(name: str, default: str | None = None) -> str | None:
    """Return a string variable; ``NAME_FILE`` (a path to a secret file) wins over ``NAME``."""
    file_path = os.environ.get(f"{name}_FILE")
    if file_path:
        try:
            return Path(file_path).read_text().strip()
        except OSError as exc:
            raise ImproperlyConfiguredEnv(f"{name}_FILE={file_path!r} cannot be read: {exc}") from exc
    value = os.environ.get(name)
    return default if value is None else value


def envbool(name: str, default: bool) -> bool:
    raw = os.environ.get(name)
    if raw is None or raw.strip() == "":  # NAME= in an env file means "not set", as for envint
        return default
    lowered = raw.strip().lower()
    if lowered in _TRUE:
        return True
    if lowered in _FALSE:
        return False
    raise ImproperlyConfiguredEnv(f"{name}={raw!r} is not a boolean; use 1/0, true/false, yes/no or on/off")


def envint(name: str, default: int, *, minimum: int | None = None, maximum: int | None = None) -> int:
    raw = os.environ.get(name)
    if raw is None or raw.strip() == "":
        return default
    try:
        value = int(raw)
    except ValueError as exc:
        raise ImproperlyConfiguredEnv(f"{name}={raw!r} is not an integer") from exc
    if minimum is not None and value < minimum:
        raise ImproperlyConfiguredEnv(f"{name}={value} is below the minimum of {minimum}")
    if maximum is not None and value > maximum:
        raise ImproperlyConfiguredEnv(f"{name}={value} is above the maximum of {maximum}")
    return value


def envfloat(name: str, default: float, *, minimum: float | None = None) -> float:
    raw = os.environ.get(name)
    if raw is None or raw.strip() == "":
        return default
    try:
        value = float(raw)
    except ValueError as exc:
        raise ImproperlyConfiguredEnv(f"{name}={raw!r} is not a number") from exc
    if not math.isfinite(value) or (minimum is not None and value < minimum):
        raise ImproperlyConfiguredEnv(f"{name}={raw!r} must be a finite number of at least {minimum}")
    return value


def envlist(name: str, default: list[str]) -> list[str]:
    raw = os.environ.get(name)
    if raw is None:
        return default
    return [item.strip() for item in raw.split(",") if item.strip()]
