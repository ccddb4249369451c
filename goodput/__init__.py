"""The project shell: what joins the apps into one console (URLs, the ASGI entry point, the demo).

It sits above every app (``console`` <- ``incidents`` <- ``fleet`` <- ``compliance`` <- ``goodput``):
it may import any of them, and none of them imports it (tests/test_imports.py). The settings and
the Celery app stay in ``console``: they import no app (they name them in strings Django and
Celery resolve at start-up), and ``DJANGO_SETTINGS_MODULE=console.settings`` and ``celery -A
console`` are what deployments already run.
"""
