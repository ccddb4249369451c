"""Retention deletes incidents past their policy together with their timelines (issue 14, item 4).

incidents' migration 0002 refuses every UPDATE and DELETE on incidents_timelineentry. This keeps
that, and lets a DELETE through only in a transaction that set ``goodput.retention_purge`` to 'on'
(SET LOCAL, done only by compliance.services.retention when it applies the incidents policy, a run
that is itself recorded and audited) — the same shape as the audit log's ``goodput.audit_purge``.
UPDATE stays refused always.
"""

from django.db import migrations

SQL = """
CREATE OR REPLACE FUNCTION incidents_timeline_append_only() RETURNS trigger AS $$
BEGIN
    IF TG_OP = 'DELETE' AND coalesce(current_setting('goodput.retention_purge', true), '') = 'on' THEN
        RETURN OLD;
    END IF;
    RAISE EXCEPTION 'incident timeline entries are append-only (% refused)', TG_OP;
END;
$$ LANGUAGE plpgsql;
"""

REVERSE = """
CREATE OR REPLACE FUNCTION incidents_timeline_append_only() RETURNS trigger AS $$
BEGIN
    RAISE EXCEPTION 'incident timeline entries are append-only (% refused)', TG_OP;
END;
$$ LANGUAGE plpgsql;
"""


class Migration(migrations.Migration):
    dependencies = [("compliance", "0002_append_only"), ("incidents", "0002_timeline_append_only")]

    operations = [migrations.RunSQL(SQL, REVERSE)]
