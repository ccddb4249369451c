"""Signals the apps send each other without importing each other.

``row_changed``: a service changed a row with a conditional UPDATE (a state transition that must
not race), which sends no ``post_save``. It is sent after the UPDATE, inside its transaction, with

- ``sender``: the model class;
- ``instance``: the row as it is now (refreshed);
- ``before``: the changed fields' previous values, by field name;
- ``message``: what happened, in words ("Approved", "Revoked").

The compliance app writes it to the audit log, as it does every ``post_save`` of an audited model.

``backup_finished`` and ``restore_finished``: `manage.py backup` and `manage.py restore` ran (the
console's own database). Sent with ``dump`` (the dump's path), ``started``, ``finished`` and, for a
backup, ``size`` and ``ok``; for a restore, ``target`` (where it went: host and database),
``verified`` (the manifest comparison ran and found no mismatch) and ``verification`` (what it
found, in words). The compliance app records them in the recovery register. The commands send them
with ``send_robust``: a register that cannot be written (the very database being restored may be
down) never fails the backup or the restore.
"""

from __future__ import annotations

from django.dispatch import Signal

row_changed = Signal()
backup_finished = Signal()
restore_finished = Signal()
