from __future__ import annotations

from celery import shared_task

from console import live


@shared_task(acks_late=False, ignore_result=True)
def push_live_topic(topic: str) -> None:
    """Push one coalesced delta (a lost push is healed by the next: no late ack needed)."""
    live.push_topic(topic)
