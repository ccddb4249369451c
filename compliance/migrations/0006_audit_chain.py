"""The audit log no database session can rewrite (issue 22): a hash chain sealed at commit, one
purge function that keeps the audit floor and records itself, no session-setting bypass.

- ``goodput_audit_content(entry)``: the text an entry's ``content_hash`` is the SHA-256 of: each
  field as ``<length>:<text>`` (``~`` for NULL), in the order id, at (UTC, microseconds), actor_id,
  actor, action, app_label, model, object_id, object_repr, before, after (jsonb text), message,
  remote_addr (host). compliance.services.audit.content_text builds the same string in Python.
- ``goodput_audit_seal_from(id)`` (SECURITY DEFINER): writes a ``compliance_auditseal`` row for each
  unsealed entry from that id on, in id order: ``seq`` one past the last, ``prev_hash`` the last
  one's ``hash``, ``content_hash``, and ``hash = sha256(prev_hash || content_hash)`` (hex text). A
  constraint trigger deferred to commit calls it with the transaction's first unsealed entry,
  under a transaction advisory lock, so ``seq`` follows commit order (and the transaction's other
  entries find theirs done). ``goodput_audit_seal_pending()`` seals whatever is unsealed now (the
  entries written before this migration; a test's, inside its transaction). An entry is never
  updated, not even to seal it.
- ``goodput_audit_purge(cutoff, actor)`` (SECURITY DEFINER): deletes entries older than the cutoff
  and older than the floor (``goodput_audit_settings``, at least 365 days; `manage.py migrate`
  writes GOODPUT_AUDIT_RETENTION_FLOOR_DAYS there), never the newest, and writes an entry of
  action ``purge`` naming the sequence ranges it removed and the hash each ended on, so the chain
  can be walked across them.
- The append-only triggers (on entries and seals) refuse every UPDATE, and let a DELETE through
  only inside the purge function, as the table owner (its SECURITY DEFINER identity): no session
  setting does.
  ``goodput.audit_purge`` and ``goodput.retention_purge`` open nothing any more. They fire
  ALWAYS, so ``session_replication_role = replica`` skips none of them.
- ``goodput_purge_incident_timeline(incident_ids)`` (SECURITY DEFINER): the timeline entries of
  resolved incidents, for the retention run; nothing else deletes a timeline entry.

The console's role gets no UPDATE, DELETE or TRUNCATE on the audit log at all (console.dbroles).
"""

import django.db.models.deletion
from django.conf import settings
from django.db import migrations, models

# Any 64-bit key of our own: one sealer at a time, so seq follows commit order.
SEAL_LOCK = 0x676F_6F64_6175_6474

SQL = """
CREATE TABLE goodput_audit_settings (
    id integer PRIMARY KEY DEFAULT 1 CHECK (id = 1),
    floor_days integer NOT NULL CHECK (floor_days >= 365)
);
INSERT INTO goodput_audit_settings (id, floor_days) VALUES (1, 2555);

-- These two have no SET clause so that the planner inlines them: a function call per field of
-- each entry sealed cost a millisecond an entry. They call only pg_catalog's functions, which
-- come first whatever the search path, and run inside the functions below, which set theirs.
CREATE FUNCTION goodput_audit_field(v text) RETURNS text LANGUAGE sql IMMUTABLE
AS $$ SELECT CASE WHEN v IS NULL THEN '~' ELSE length(v)::text || ':' || v END $$;

CREATE FUNCTION goodput_audit_content(e compliance_auditentry) RETURNS text LANGUAGE sql STABLE
AS $$
SELECT goodput_audit_field(e.id::text)
    || goodput_audit_field(to_char(e.at AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS.US"Z"'))
    || goodput_audit_field(e.actor_id::text)
    || goodput_audit_field(e.actor)
    || goodput_audit_field(e.action)
    || goodput_audit_field(e.app_label)
    || goodput_audit_field(e.model)
    || goodput_audit_field(e.object_id)
    || goodput_audit_field(e.object_repr)
    || goodput_audit_field(e.before::text)
    || goodput_audit_field(e.after::text)
    || goodput_audit_field(e.message)
    || goodput_audit_field(host(e.remote_addr))
$$;

CREATE FUNCTION goodput_audit_seal_from(p_first bigint) RETURNS bigint LANGUAGE plpgsql SECURITY DEFINER
SET search_path = {path}
-- Walk the primary key from the first id: without statistics (a new log) the planner would scan
-- and sort the whole table for each commit's one or two entries.
SET enable_seqscan = off
AS $$
DECLARE
    e compliance_auditentry;
    last_seq bigint;
    last_hash text;
    digest text;
    ids bigint[] := '{}';
    seqs bigint[] := '{}';
    digests text[] := '{}';
    prevs text[] := '{}';
    hashes text[] := '{}';
BEGIN
    IF current_setting('transaction_isolation') <> 'read committed' THEN
        -- A snapshot older than the last commit would fork the chain.
        RAISE EXCEPTION 'audit entries are sealed in READ COMMITTED transactions only (this one is %)',
            current_setting('transaction_isolation');
    END IF;
    PERFORM pg_advisory_xact_lock({lock});
    SELECT s.seq, s.hash INTO last_seq, last_hash FROM compliance_auditseal s ORDER BY s.seq DESC LIMIT 1;
    IF last_seq IS NULL THEN
        last_seq := 0;
        last_hash := repeat('0', 64);
    END IF;
    -- A transaction's entries have rising ids: from its first unsealed one on, in the order written.
    FOR e IN SELECT * FROM compliance_auditentry a WHERE a.id >= p_first ORDER BY a.id LOOP
        CONTINUE WHEN EXISTS (SELECT 1 FROM compliance_auditseal s WHERE s.entry_id = e.id);
        digest := encode(sha256(convert_to(goodput_audit_content(e), 'UTF8')), 'hex');
        last_seq := last_seq + 1;
        ids := ids || e.id;
        seqs := seqs || last_seq;
        digests := digests || digest;
        prevs := prevs || last_hash;
        last_hash := encode(sha256(convert_to(last_hash || digest, 'UTF8')), 'hex');
        hashes := hashes || last_hash;
    END LOOP;
    INSERT INTO compliance_auditseal (entry_id, seq, content_hash, prev_hash, hash)
    SELECT * FROM unnest(ids, seqs, digests, prevs, hashes);
    RETURN cardinality(ids);
END
$$;

CREATE FUNCTION goodput_audit_seal_pending() RETURNS bigint LANGUAGE plpgsql SECURITY DEFINER
SET search_path = {path}
AS $$
BEGIN
    RETURN goodput_audit_seal_from(0);
END
$$;

CREATE FUNCTION goodput_audit_seal() RETURNS trigger LANGUAGE plpgsql SECURITY DEFINER
SET search_path = {path}
AS $$
BEGIN
    -- The transaction's first entry to get here seals them all; the others find theirs done.
    IF NOT EXISTS (SELECT 1 FROM compliance_auditseal s WHERE s.entry_id = NEW.id) THEN
        PERFORM goodput_audit_seal_from(NEW.id);
    END IF;
    RETURN NULL;
END
$$;

CREATE FUNCTION goodput_audit_purge(p_cutoff timestamptz, p_actor text DEFAULT 'system') RETURNS bigint
LANGUAGE plpgsql SECURITY DEFINER
SET search_path = {path}
AS $$
DECLARE
    keep_days integer;
    purge_before timestamptz;
    head bigint;
    deleted bigint;
    spans jsonb;
BEGIN
    PERFORM goodput_audit_seal_pending();
    SELECT greatest(365, coalesce((SELECT s.floor_days FROM goodput_audit_settings s WHERE s.id = 1), 2555))
      INTO keep_days;
    purge_before := least(p_cutoff, now() - make_interval(days => keep_days));
    SELECT max(s.seq) INTO head FROM compliance_auditseal s;
    WITH doomed AS (
        SELECT s.entry_id FROM compliance_auditseal s JOIN compliance_auditentry a ON a.id = s.entry_id
         WHERE a.at < purge_before AND s.seq < head
    ), gone_entries AS (
        DELETE FROM compliance_auditentry a USING doomed d WHERE a.id = d.entry_id RETURNING a.id
    ), gone AS (
        DELETE FROM compliance_auditseal s USING doomed d WHERE s.entry_id = d.entry_id RETURNING s.seq, s.hash
    ), runs AS (
        SELECT g.seq, g.hash, g.seq - row_number() OVER (ORDER BY g.seq) AS run FROM gone g
    ), ranges AS (
        SELECT min(r.seq) AS lo, max(r.seq) AS hi, count(*) AS n, (array_agg(r.hash ORDER BY r.seq DESC))[1] AS last_hash
          FROM runs r GROUP BY r.run
    )
    SELECT coalesce(sum(n), 0), coalesce(jsonb_agg(jsonb_build_array(lo, hi, last_hash) ORDER BY lo), '[]'::jsonb)
      INTO deleted, spans FROM ranges;
    IF deleted > 0 THEN
        INSERT INTO compliance_auditentry
            (at, actor_id, actor, action, app_label, model, object_id, object_repr, before, after, message, remote_addr)
        VALUES (
            clock_timestamp(), NULL, left(coalesce(nullif(p_actor, ''), 'system'), 200), 'purge', 'compliance',
            'auditentry', '', '', NULL,
            jsonb_build_object('cutoff', purge_before, 'floor_days', keep_days, 'deleted', deleted, 'seq_ranges', spans),
            left(format('audit purge: %s entries older than %s deleted (floor %s days)', deleted, purge_before, keep_days), 500),
            NULL
        );
        PERFORM goodput_audit_seal_pending();
    END IF;
    RETURN deleted;
END
$$;

CREATE FUNCTION goodput_audit_append_only() RETURNS trigger LANGUAGE plpgsql
SET search_path = {path}
AS $$
DECLARE
    ctx text;
BEGIN
    -- Only the purge function, running as the owner (SECURITY DEFINER), deletes; nothing updates.
    IF TG_OP = 'DELETE'
       AND current_user = (SELECT pg_get_userbyid(c.relowner) FROM pg_class c WHERE c.oid = TG_RELID) THEN
        GET DIAGNOSTICS ctx = PG_CONTEXT;
        IF position('function goodput_audit_purge(' in ctx) > 0 THEN
            RETURN OLD;
        END IF;
    END IF;
    RAISE EXCEPTION '% is append-only: % refused', TG_TABLE_NAME, TG_OP USING ERRCODE = 'insufficient_privilege';
END
$$;

DROP TRIGGER auditentry_append_only ON compliance_auditentry;
CREATE TRIGGER auditentry_append_only BEFORE UPDATE OR DELETE ON compliance_auditentry
    FOR EACH ROW EXECUTE FUNCTION goodput_audit_append_only();
CREATE TRIGGER auditseal_append_only BEFORE UPDATE OR DELETE ON compliance_auditseal
    FOR EACH ROW EXECUTE FUNCTION goodput_audit_append_only();
CREATE CONSTRAINT TRIGGER auditentry_seal AFTER INSERT ON compliance_auditentry
    DEFERRABLE INITIALLY DEFERRED FOR EACH ROW EXECUTE FUNCTION goodput_audit_seal();

-- Published summaries: frozen, and the purge setting of migration 0002 opens nothing.
CREATE OR REPLACE FUNCTION goodput_refuse_change() RETURNS trigger LANGUAGE plpgsql
SET search_path = {path}
AS $$
BEGIN
    RAISE EXCEPTION '% is append-only: % refused', TG_TABLE_NAME, TG_OP USING ERRCODE = 'insufficient_privilege';
END
$$;

CREATE FUNCTION goodput_purge_incident_timeline(p_incident_ids bigint[]) RETURNS bigint
LANGUAGE plpgsql SECURITY DEFINER
SET search_path = {path}
AS $$
DECLARE
    deleted bigint;
BEGIN
    DELETE FROM incidents_timelineentry t USING incidents_incident i
     WHERE t.incident_id = i.id AND i.id = ANY (p_incident_ids)
       AND i.state = 'resolved' AND i.resolved_at IS NOT NULL;
    GET DIAGNOSTICS deleted = ROW_COUNT;
    RETURN deleted;
END
$$;

CREATE OR REPLACE FUNCTION incidents_timeline_append_only() RETURNS trigger LANGUAGE plpgsql
SET search_path = {path}
AS $$
DECLARE
    ctx text;
BEGIN
    IF TG_OP = 'DELETE'
       AND current_user = (SELECT pg_get_userbyid(c.relowner) FROM pg_class c WHERE c.oid = TG_RELID) THEN
        GET DIAGNOSTICS ctx = PG_CONTEXT;
        IF position('function goodput_purge_incident_timeline(' in ctx) > 0 THEN
            RETURN OLD;
        END IF;
    END IF;
    RAISE EXCEPTION 'incident timeline entries are append-only (% refused)', TG_OP;
END
$$;

ALTER TABLE compliance_auditentry ENABLE ALWAYS TRIGGER auditentry_append_only;
ALTER TABLE compliance_auditentry ENABLE ALWAYS TRIGGER auditentry_seal;
ALTER TABLE compliance_auditseal ENABLE ALWAYS TRIGGER auditseal_append_only;
ALTER TABLE compliance_summaryversion ENABLE ALWAYS TRIGGER summaryversion_frozen;
ALTER TABLE incidents_timelineentry ENABLE ALWAYS TRIGGER incidents_timelineentry_append_only;

REVOKE EXECUTE ON FUNCTION goodput_audit_purge(timestamptz, text), goodput_audit_seal_pending(),
    goodput_audit_seal_from(bigint), goodput_audit_seal(), goodput_purge_incident_timeline(bigint[]) FROM PUBLIC;

-- Entries written before this migration: sealed now, in id order.
SELECT goodput_audit_seal_pending();
"""

REVERSE = """
ALTER TABLE compliance_summaryversion ENABLE TRIGGER summaryversion_frozen;
ALTER TABLE incidents_timelineentry ENABLE TRIGGER incidents_timelineentry_append_only;
DROP TRIGGER auditentry_seal ON compliance_auditentry;
DROP TRIGGER auditseal_append_only ON compliance_auditseal;
DROP TRIGGER auditentry_append_only ON compliance_auditentry;
CREATE OR REPLACE FUNCTION goodput_refuse_change() RETURNS trigger AS $$
BEGIN
    IF TG_OP = 'DELETE' AND TG_ARGV[0] = 'purgeable'
       AND coalesce(current_setting('goodput.audit_purge', true), '') = 'on' THEN
        RETURN OLD;
    END IF;
    RAISE EXCEPTION '% is append-only: % refused', TG_TABLE_NAME, TG_OP
        USING ERRCODE = 'insufficient_privilege';
END;
$$ LANGUAGE plpgsql;
CREATE TRIGGER auditentry_append_only BEFORE UPDATE OR DELETE ON compliance_auditentry
    FOR EACH ROW EXECUTE FUNCTION goodput_refuse_change('purgeable');
CREATE OR REPLACE FUNCTION incidents_timeline_append_only() RETURNS trigger AS $$
BEGIN
    IF TG_OP = 'DELETE' AND coalesce(current_setting('goodput.retention_purge', true), '') = 'on' THEN
        RETURN OLD;
    END IF;
    RAISE EXCEPTION 'incident timeline entries are append-only (% refused)', TG_OP;
END;
$$ LANGUAGE plpgsql;
DROP FUNCTION goodput_purge_incident_timeline(bigint[]);
DROP FUNCTION goodput_audit_append_only();
DROP FUNCTION goodput_audit_purge(timestamptz, text);
DROP FUNCTION goodput_audit_seal();
DROP FUNCTION goodput_audit_seal_pending();
DROP FUNCTION goodput_audit_seal_from(bigint);
DROP FUNCTION goodput_audit_content(compliance_auditentry);
DROP FUNCTION goodput_audit_field(text);
DROP TABLE goodput_audit_settings;
"""


def _search_path(schema_editor) -> str:
    """The SECURITY DEFINER functions' search path: the migrated schema, then pg_temp last, so a
    caller's temporary table can never stand in for one of ours."""
    with schema_editor.connection.cursor() as cursor:
        cursor.execute("SELECT quote_ident(current_schema())")
        return f"{cursor.fetchone()[0]}, pg_temp"


def forwards(apps, schema_editor) -> None:
    with schema_editor.connection.cursor() as cursor:
        cursor.execute(SQL.replace("{path}", _search_path(schema_editor)).replace("{lock}", str(SEAL_LOCK)))


def backwards(apps, schema_editor) -> None:
    with schema_editor.connection.cursor() as cursor:
        cursor.execute(REVERSE)


class Migration(migrations.Migration):
    dependencies = [
        ("compliance", "0005_pack_chunks_summary_pdf"),
        ("incidents", "0002_timeline_append_only"),
        migrations.swappable_dependency(settings.AUTH_USER_MODEL),
    ]

    operations = [
        migrations.CreateModel(
            name="AuditChainCheck",
            fields=[
                ("id", models.BigAutoField(auto_created=True, primary_key=True, serialize=False, verbose_name="ID")),
                ("checked_at", models.DateTimeField(db_index=True)),
                ("ok", models.BooleanField()),
                ("entries", models.BigIntegerField(help_text="Entries walked")),
                ("head_seq", models.BigIntegerField(blank=True, null=True)),
                ("head_hash", models.CharField(blank=True, max_length=64)),
                (
                    "problem",
                    models.CharField(
                        blank=True, help_text="The first entry that did not match, and how", max_length=500
                    ),
                ),
                ("first_bad_entry", models.BigIntegerField(blank=True, null=True)),
                ("duration_ms", models.PositiveIntegerField(default=0)),
                ("triggered_by", models.CharField(max_length=100)),
            ],
            options={
                "ordering": ["-checked_at", "-pk"],
            },
        ),
        migrations.CreateModel(
            name="AuditSeal",
            fields=[
                (
                    "entry",
                    models.OneToOneField(
                        db_constraint=False,
                        on_delete=django.db.models.deletion.DO_NOTHING,
                        primary_key=True,
                        related_name="seal",
                        serialize=False,
                        to="compliance.auditentry",
                    ),
                ),
                ("seq", models.BigIntegerField(help_text="Place in the chain, in commit order", unique=True)),
                ("content_hash", models.CharField(help_text="SHA-256 of the entry's content", max_length=64)),
                (
                    "prev_hash",
                    models.CharField(help_text="The hash of the entry before (64 zeros for the first)", max_length=64),
                ),
                ("hash", models.CharField(help_text="SHA-256 of prev_hash followed by content_hash", max_length=64)),
            ],
            options={
                "ordering": ["seq"],
            },
        ),
        migrations.AddField(
            model_name="legalhold",
            name="release_requested_at",
            field=models.DateTimeField(blank=True, null=True),
        ),
        migrations.AddField(
            model_name="legalhold",
            name="release_requested_by",
            field=models.ForeignKey(
                blank=True,
                null=True,
                on_delete=django.db.models.deletion.SET_NULL,
                related_name="+",
                to=settings.AUTH_USER_MODEL,
            ),
        ),
        migrations.AddField(
            model_name="legalhold",
            name="released_by",
            field=models.ForeignKey(
                blank=True,
                null=True,
                on_delete=django.db.models.deletion.SET_NULL,
                related_name="+",
                to=settings.AUTH_USER_MODEL,
            ),
        ),
        migrations.AlterField(
            model_name="auditentry",
            name="action",
            field=models.CharField(
                choices=[
                    ("create", "Create"),
                    ("update", "Update"),
                    ("delete", "Delete"),
                    ("export", "Export"),
                    ("action", "Action"),
                    ("purge", "Purge"),
                    ("sign_in", "Sign-in"),
                    ("sign_out", "Sign-out"),
                    ("sign_in_failed", "Failed sign-in"),
                    ("lockout", "Lock-out"),
                ],
                max_length=16,
            ),
        ),
        migrations.RunPython(forwards, backwards),
    ]
