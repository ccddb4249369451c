"""Notifications: an incident event routed to the channels that want it (``routing``), each channel's
payload delivered from Celery with retries (``delivery``, ``tasks``).

The engine queues through ``routing``, which queues the ``tasks``, which run ``delivery``: arrows that
point one way, so nothing here imports the engine and the engine's tasks never reach back.
"""
