"""Embedded mode's stand-in for `celery beat`: the same CELERY_BEAT_SCHEDULE, run in a thread.

Production runs `celery beat` against Redis; embedded mode has no broker, so the demo process
runs each periodic task eagerly at its interval. The schedule is defined once, in settings.
"""

from __future__ import annotations

import logging
import threading
import time

from django.conf import settings
from django.db import connections

from console.celery import app

logger = logging.getLogger(__name__)


class EmbeddedBeat(threading.Thread):
    def __init__(self, stop: threading.Event) -> None:
        super().__init__(name="embedded-beat", daemon=True)
        self.stop_event = stop
        self.entries = [(name, e["task"], float(e["schedule"])) for name, e in settings.CELERY_BEAT_SCHEDULE.items()]

    def run(self) -> None:
        # A worker imports every app's tasks module at start; this thread must do the same.
        app.loader.import_default_modules()
        due = {name: time.monotonic() for name, _, _ in self.entries}  # everything runs once at start
        while not self.stop_event.is_set():
            now = time.monotonic()
            for name, task, interval in self.entries:
                if now >= due[name]:
                    due[name] = now + interval
                    self._run(name, task)
            self.stop_event.wait(max(0.2, min(due.values()) - time.monotonic()))
        connections.close_all()

    def _run(self, name: str, task: str) -> None:
        try:
            app.tasks[task].apply(throw=True)
        except Exception:  # one failing task must not stop the schedule
            logger.exception("periodic task %s failed", name)
        finally:
            connections.close_all()
