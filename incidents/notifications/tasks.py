"""The notifications' Celery task. Its name stays the one it had in ``incidents.tasks`` (where it is
re-exported), so deliveries queued before a deploy still run after it."""

from __future__ import annotations

from celery import shared_task

from incidents.notifications import delivery


@shared_task(name="incidents.tasks.send_notification", bind=True, ignore_result=True, max_retries=delivery.MAX_ATTEMPTS)
def send_notification(self, notification_id: int) -> bool:  # type: ignore[no-untyped-def]
    """Deliver one notification; a failure is retried with exponential backoff by the broker.

    Eager mode (embedded, one process) has no broker to hold a countdown: it retries at once,
    still recording each attempt and the backoff production would have used.
    """
    while True:
        result = delivery.deliver(notification_id)
        if result is True or result is False:
            return result
        if not self.request.is_eager:
            raise self.retry(countdown=result)
