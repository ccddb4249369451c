"""Settings come from the environment; bad values stop start-up with a message naming the variable."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from console.env import ImproperlyConfiguredEnv, env, envbool, envint

ROOT = Path(__file__).resolve().parents[2]


def start(**overrides: str | None) -> subprocess.CompletedProcess[str]:
    """Load the settings in a fresh interpreter with the given environment."""
    environment = {k: v for k, v in os.environ.items() if k not in ("DATABASE_URL", "REDIS_URL", "SECRET_KEY", "DEBUG")}
    environment.update({k: v for k, v in overrides.items() if v is not None})
    environment["DJANGO_SETTINGS_MODULE"] = "console.settings"
    return subprocess.run(
        [
            sys.executable,
            "-c",
            "import django; django.setup(); from console.runtime import describe_mode; print(describe_mode())",
        ],
        cwd=ROOT,
        env=environment,
        capture_output=True,
        text=True,
        timeout=60,
    )


def test_production_without_a_broker_is_an_error_not_eager_mode() -> None:
    result = start(DATABASE_URL="postgres://postgres@127.0.0.1:5432/postgres", SECRET_KEY="s", ALLOWED_HOSTS="x")
    assert result.returncode != 0
    assert "REDIS_URL is not" in result.stderr


def test_production_needs_a_secret_key_and_allowed_hosts() -> None:
    base = {"DATABASE_URL": "postgres://postgres@127.0.0.1:5432/postgres", "REDIS_URL": "redis://127.0.0.1:6379/15"}
    result = start(**base, ALLOWED_HOSTS="console.example")
    assert result.returncode != 0 and "SECRET_KEY must be set" in result.stderr
    result = start(**base, SECRET_KEY="s", ALLOWED_HOSTS="")
    assert result.returncode != 0 and "ALLOWED_HOSTS" in result.stderr


def test_production_mode_is_said_plainly() -> None:
    result = start(
        DATABASE_URL="postgres://postgres@127.0.0.1:5432/postgres",
        REDIS_URL="redis://127.0.0.1:6379/15",
        SECRET_KEY="s",
        ALLOWED_HOSTS="console.example",
    )
    assert result.returncode == 0, result.stderr
    assert "production mode" in result.stdout and "Redis broker" in result.stdout


def test_a_bad_boolean_names_the_variable() -> None:
    result = start(DEBUG="maybe")
    assert result.returncode != 0 and "DEBUG='maybe' is not a boolean" in result.stderr


def test_a_database_url_that_is_not_postgres_is_refused() -> None:
    result = start(
        DATABASE_URL="mysql://root@127.0.0.1/test",
        REDIS_URL="redis://127.0.0.1:6379/15",
        SECRET_KEY="s",
        ALLOWED_HOSTS="x",
    )
    assert result.returncode != 0 and "PostgreSQL" in result.stderr


def test_typed_helpers(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("X_INT", "12")
    assert envint("X_INT", 1, minimum=10) == 12
    monkeypatch.setenv("X_INT", "9")
    with pytest.raises(ImproperlyConfiguredEnv, match="X_INT=9 is below the minimum of 10"):
        envint("X_INT", 1, minimum=10)
    monkeypatch.setenv("X_INT", "ten")
    with pytest.raises(ImproperlyConfiguredEnv, match="not an integer"):
        envint("X_INT", 1)
    monkeypatch.setenv("X_BOOL", "Yes")
    assert envbool("X_BOOL", False) is True
    secret = tmp_path / "secret"
    secret.write_text("from-file\n")
    monkeypatch.setenv("X_SECRET", "from-env")
    monkeypatch.setenv("X_SECRET_FILE", str(secret))
    assert env("X_SECRET") == "from-file"


def test_a_cost_currency_that_is_not_an_iso_code_names_the_variable() -> None:
    result = start(GOODPUT_COST_CURRENCY="euro", SECRET_KEY="s")
    assert result.returncode != 0
    assert "GOODPUT_COST_CURRENCY='euro' is not a three-letter ISO 4217 code" in result.stderr
