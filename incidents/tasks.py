"""Celery tasks of the incidents app: thin wrappers that hand off to the detectors and the engine.
The notifications' delivery task lives beside its delivery (incidents.notifications.tasks) under
its name here."""

from __future__ import annotations

from celery import shared_task

from incidents import detectors
from incidents.notifications.tasks import send_notification
from incidents.services.engine import auto_resolve_due

# registered by this module's import
__all__ = ["send_notification"]


@shared_task(ignore_result=True, acks_late=False)
def run_detectors() -> dict:
    return detectors.run_detectors()


@shared_task(ignore_result=True, acks_late=False)
def resolve_held_down_incidents() -> list[int]:
    return auto_resolve_due()
