"""The Celery application. Settings come from Django's (``CELERY_*``)."""

from __future__ import annotations

import os

from celery import Celery
from celery.signals import worker_process_init, worker_process_shutdown, worker_ready

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "console.settings")

app = Celery("goodput")
app.config_from_object("django.conf:settings", namespace="CELERY")
app.autodiscover_tasks()


@worker_ready.connect
def _announce(**kwargs: object) -> None:
    from console.runtime import announce_mode

    announce_mode("worker")
    _settle()


@worker_process_init.connect
def _settle(**kwargs: object) -> None:
    """The worker's (or a prefork child's) start-up objects out of the collector's walks
    (console.runtime.settle_heap): tasks then never pause for them."""
    from console.runtime import settle_heap

    settle_heap()


@worker_process_shutdown.connect
def _flush_counters(**kwargs: object) -> None:
    """A prefork pool process ends with os._exit, which skips atexit: write its counts first."""
    from console import counters

    counters.flush()
