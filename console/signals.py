"""Signals the apps send each other without importing each other.

``row_changed``: a service changed a row with a conditional UPDATE (a state transition that must
not race), which sends no ``post_save``. It is sent after the UPDATE, inside its transaction, with

- ``sender``: the model class;
- ``instance``: the row as it is now (refreshed);
- ``before``: the changed fields' previous values, by field name;
- ``message``: what happened, in words ("Approved", "Revoked").

The compliance app writes it to the audit log, as it does every ``post_save`` of an audited model.
"""

from __future__ import annotations

from django.dispatch import Signal

row_changed = Signal()
