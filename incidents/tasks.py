from __future__ import annotations

from celery import shared_task

from incidents.services import notify
from incidents.services.engine import auto_resolve_due


@shared_task(ignore_result=True, acks_late=False)
def run_detectors() -> dict:
    from incidents.detectors import run_detectors as run

    return run()


@shared_task(ignore_result=True, acks_late=False)
def resolve_held_down_incidents() -> list[int]:
    return auto_resolve_due()


@shared_task(bind=True, ignore_result=True, max_retries=notify.MAX_ATTEMPTS)
def send_notification(self, notification_id: int) -> bool:  # type: ignore[no-untyped-def]
    """Deliver one notification; a failure is retried with exponential backoff by the broker.

    Eager mode (embedded, one process) has no broker to hold a countdown: it retries at once,
    still recording each attempt and the backoff production would have used.
    """
    while True:
        result = notify.deliver(notification_id)
        if result is True or result is False:
            return result
        if not self.request.is_eager:
            raise self.retry(countdown=result)
