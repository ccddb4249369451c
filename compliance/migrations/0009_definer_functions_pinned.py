"""The owner's functions run nothing the console's role can create (issue 37, item 1), and only the
owner's verification function writes "hash chain verified" (item 2).

Migration 0006's SECURITY DEFINER functions looked names up through ``<schema>, pg_temp``, and the
console's role could CREATE in that schema: a function with the name and argument types of one
they call (``goodput_audit_field(character varying)`` matches ``e.actor`` better than the owner's
``(text)``) then ran as the owner. PostgreSQL's documentation for SECURITY DEFINER prescribes what
this migration does to every function of ours, definer or trigger:

- ``SET search_path = pg_catalog, pg_temp``: built-in names resolve first, and pg_temp (where any
  role may make temporary objects) is searched last and never for functions or operators;
- every table, type and function of ours is schema-qualified, and our functions are called with
  arguments of their exact types (``::text``), so no overload is a better match;
- the console's role loses CREATE on the schema (console.dbroles; fleet migration 0024 moves the
  partitions it made to the owner's functions).

``goodput_audit_field`` and ``goodput_audit_content`` keep no SET clause so the planner inlines
them (a call per field cost a millisecond an entry); they call only built-ins and each other
(qualified), and run inside the functions below, whose path is pinned.

``goodput_audit_verify(anchor seqs, hashes, times, triggered_by)`` walks the chain as
compliance.services.audit_chain.verify_chain does (same rules, same messages) and records the
check; the console's role may only read ``compliance_auditchaincheck``.
"""

import re

from django.db import migrations

# Any 64-bit key of our own: one sealer at a time, so seq follows commit order (as in 0006).
SEAL_LOCK = 0x676F_6F64_6175_6474

SQL = """
CREATE OR REPLACE FUNCTION {s}.goodput_audit_field(v text) RETURNS text LANGUAGE sql IMMUTABLE
AS $$ SELECT CASE WHEN v IS NULL THEN '~' ELSE pg_catalog.length(v)::text || ':' || v END $$;

CREATE OR REPLACE FUNCTION {s}.goodput_audit_content(e {s}.compliance_auditentry) RETURNS text LANGUAGE sql STABLE
AS $$
SELECT {s}.goodput_audit_field(e.id::text)
    || {s}.goodput_audit_field(pg_catalog.to_char(e.at AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS.US"Z"'))
    || {s}.goodput_audit_field(e.actor_id::text)
    || {s}.goodput_audit_field(e.actor::text)
    || {s}.goodput_audit_field(e.action::text)
    || {s}.goodput_audit_field(e.app_label::text)
    || {s}.goodput_audit_field(e.model::text)
    || {s}.goodput_audit_field(e.object_id::text)
    || {s}.goodput_audit_field(e.object_repr::text)
    || {s}.goodput_audit_field(e.before::text)
    || {s}.goodput_audit_field(e.after::text)
    || {s}.goodput_audit_field(e.message::text)
    || {s}.goodput_audit_field(pg_catalog.host(e.remote_addr))
$$;

CREATE OR REPLACE FUNCTION {s}.goodput_audit_seal_from(p_first bigint) RETURNS bigint
LANGUAGE plpgsql SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
-- Walk the primary key from the first id: without statistics (a new log) the planner would scan
-- and sort the whole table for each commit's one or two entries.
SET enable_seqscan = off
AS $$
DECLARE
    e {s}.compliance_auditentry;
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
    SELECT s.seq, s.hash INTO last_seq, last_hash FROM {s}.compliance_auditseal s ORDER BY s.seq DESC LIMIT 1;
    IF last_seq IS NULL THEN
        last_seq := 0;
        last_hash := repeat('0', 64);
    END IF;
    -- A transaction's entries have rising ids: from its first unsealed one on, in the order written.
    FOR e IN SELECT * FROM {s}.compliance_auditentry a WHERE a.id >= p_first ORDER BY a.id LOOP
        CONTINUE WHEN EXISTS (SELECT 1 FROM {s}.compliance_auditseal s WHERE s.entry_id = e.id);
        digest := encode(sha256(convert_to({s}.goodput_audit_content(e), 'UTF8')), 'hex');
        last_seq := last_seq + 1;
        ids := ids || e.id;
        seqs := seqs || last_seq;
        digests := digests || digest;
        prevs := prevs || last_hash;
        last_hash := encode(sha256(convert_to(last_hash || digest, 'UTF8')), 'hex');
        hashes := hashes || last_hash;
    END LOOP;
    INSERT INTO {s}.compliance_auditseal (entry_id, seq, content_hash, prev_hash, hash)
    SELECT * FROM unnest(ids, seqs, digests, prevs, hashes);
    RETURN cardinality(ids);
END
$$;

CREATE OR REPLACE FUNCTION {s}.goodput_audit_seal_pending() RETURNS bigint LANGUAGE plpgsql SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    RETURN {s}.goodput_audit_seal_from(0::bigint);
END
$$;

CREATE OR REPLACE FUNCTION {s}.goodput_audit_seal() RETURNS trigger LANGUAGE plpgsql SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    -- The transaction's first entry to get here seals them all; the others find theirs done.
    IF NOT EXISTS (SELECT 1 FROM {s}.compliance_auditseal s WHERE s.entry_id = NEW.id) THEN
        PERFORM {s}.goodput_audit_seal_from(NEW.id::bigint);
    END IF;
    RETURN NULL;
END
$$;

CREATE OR REPLACE FUNCTION {s}.goodput_audit_purge(p_cutoff timestamptz, p_actor text DEFAULT 'system') RETURNS bigint
LANGUAGE plpgsql SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    keep_days integer;
    purge_before timestamptz;
    head bigint;
    deleted bigint;
    spans jsonb;
BEGIN
    PERFORM {s}.goodput_audit_seal_pending();
    SELECT greatest(365, coalesce((SELECT s.floor_days FROM {s}.goodput_audit_settings s WHERE s.id = 1), 2555))
      INTO keep_days;
    purge_before := least(p_cutoff, now() - make_interval(days => keep_days));
    SELECT max(s.seq) INTO head FROM {s}.compliance_auditseal s;
    WITH doomed AS (
        SELECT s.entry_id FROM {s}.compliance_auditseal s JOIN {s}.compliance_auditentry a ON a.id = s.entry_id
         WHERE a.at < purge_before AND s.seq < head
    ), gone_entries AS (
        DELETE FROM {s}.compliance_auditentry a USING doomed d WHERE a.id = d.entry_id RETURNING a.id
    ), gone AS (
        DELETE FROM {s}.compliance_auditseal s USING doomed d WHERE s.entry_id = d.entry_id RETURNING s.seq, s.hash
    ), runs AS (
        SELECT g.seq, g.hash, g.seq - row_number() OVER (ORDER BY g.seq) AS run FROM gone g
    ), ranges AS (
        SELECT min(r.seq) AS lo, max(r.seq) AS hi, count(*) AS n, (array_agg(r.hash ORDER BY r.seq DESC))[1] AS last_hash
          FROM runs r GROUP BY r.run
    )
    SELECT coalesce(sum(n), 0), coalesce(jsonb_agg(jsonb_build_array(lo, hi, last_hash) ORDER BY lo), '[]'::jsonb)
      INTO deleted, spans FROM ranges;
    IF deleted > 0 THEN
        INSERT INTO {s}.compliance_auditentry
            (at, actor_id, actor, action, app_label, model, object_id, object_repr, before, after, message, remote_addr)
        VALUES (
            clock_timestamp(), NULL, left(coalesce(nullif(p_actor, ''), 'system'), 200), 'purge', 'compliance',
            'auditentry', '', '', NULL,
            jsonb_build_object('cutoff', purge_before, 'floor_days', keep_days, 'deleted', deleted, 'seq_ranges', spans),
            left(format('audit purge: %s entries older than %s deleted (floor %s days)', deleted, purge_before, keep_days), 500),
            NULL
        );
        PERFORM {s}.goodput_audit_seal_pending();
    END IF;
    RETURN deleted;
END
$$;

CREATE OR REPLACE FUNCTION {s}.goodput_audit_append_only() RETURNS trigger LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    ctx text;
BEGIN
    -- Only the purge function, running as the owner (SECURITY DEFINER), deletes; nothing updates.
    -- The context names it schema-qualified where the path at its compilation did not hold our schema.
    IF TG_OP = 'DELETE'
       AND current_user = (SELECT pg_get_userbyid(c.relowner) FROM pg_class c WHERE c.oid = TG_RELID) THEN
        GET DIAGNOSTICS ctx = PG_CONTEXT;
        IF ctx ~ 'function ({s}[.])?goodput_audit_purge[(]' THEN
            RETURN OLD;
        END IF;
    END IF;
    RAISE EXCEPTION '% is append-only: % refused', TG_TABLE_NAME, TG_OP USING ERRCODE = 'insufficient_privilege';
END
$$;

CREATE OR REPLACE FUNCTION {s}.goodput_refuse_change() RETURNS trigger LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    RAISE EXCEPTION '% is append-only: % refused', TG_TABLE_NAME, TG_OP USING ERRCODE = 'insufficient_privilege';
END
$$;

CREATE OR REPLACE FUNCTION {s}.goodput_purge_incident_timeline(p_incident_ids bigint[]) RETURNS bigint
LANGUAGE plpgsql SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    deleted bigint;
BEGIN
    DELETE FROM {s}.incidents_timelineentry t USING {s}.incidents_incident i
     WHERE t.incident_id = i.id AND i.id = ANY (p_incident_ids)
       AND i.state = 'resolved' AND i.resolved_at IS NOT NULL;
    GET DIAGNOSTICS deleted = ROW_COUNT;
    RETURN deleted;
END
$$;

CREATE OR REPLACE FUNCTION {s}.incidents_timeline_append_only() RETURNS trigger LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    ctx text;
BEGIN
    IF TG_OP = 'DELETE'
       AND current_user = (SELECT pg_get_userbyid(c.relowner) FROM pg_class c WHERE c.oid = TG_RELID) THEN
        GET DIAGNOSTICS ctx = PG_CONTEXT;
        IF ctx ~ 'function ({s}[.])?goodput_purge_incident_timeline[(]' THEN
            RETURN OLD;
        END IF;
    END IF;
    RAISE EXCEPTION 'incident timeline entries are append-only (% refused)', TG_OP;
END
$$;

-- The walk of compliance.services.audit_chain.verify_chain, in the database, recorded: the only
-- writer of compliance_auditchaincheck. Anchors are earlier heads (seq, hash, and the entry's time
-- where known): each must still be in the chain, or inside a range a purge removed when the head
-- was older than that purge's cutoff.
CREATE FUNCTION {s}.goodput_audit_verify(
    p_anchor_seqs bigint[], p_anchor_hashes text[], p_anchor_ats timestamptz[], p_triggered_by text
) RETURNS bigint LANGUAGE plpgsql SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    started timestamptz := clock_timestamp();
    ok boolean := true;
    problem text := '';
    bad bigint;
    n bigint := 0;
    prev_seq bigint := 0;
    prev_hash text := repeat('0', 64);
    prev_id bigint;
    spans jsonb := '{}';  -- lo -> [hi, last_hash, purge entry id, cutoff]
    found jsonb := '{}';  -- anchored seq -> the hash the chain holds there
    adding jsonb;
    p record;
    r record;
    rng jsonb;
    cutoff timestamptz;
    here bigint;
    bridged text;
    span jsonb;
    i integer;
    a_seq bigint;
    a_at timestamptz;
    check_id bigint;
BEGIN
    IF coalesce(cardinality(p_anchor_seqs), 0) <> coalesce(cardinality(p_anchor_hashes), 0)
       OR coalesce(cardinality(p_anchor_seqs), 0) <> coalesce(cardinality(p_anchor_ats), 0) THEN
        RAISE EXCEPTION 'anchors: as many seqs, hashes and times' USING ERRCODE = 'invalid_parameter_value';
    END IF;
    FOR p IN SELECT a.id, a.at, a.after FROM {s}.compliance_auditentry a
              WHERE a.action = 'purge' AND a.app_label = 'compliance' AND a.model = 'auditentry' ORDER BY a.id LOOP
        BEGIN
            cutoff := (p.after ->> 'cutoff')::timestamptz;
            IF cutoff IS NULL OR jsonb_typeof(p.after -> 'seq_ranges') IS DISTINCT FROM 'array' THEN
                RAISE EXCEPTION 'unreadable';
            END IF;
            adding := '{}';
            FOR rng IN SELECT x FROM jsonb_array_elements(p.after -> 'seq_ranges') x LOOP
                IF (rng ->> 0)::bigint IS NULL OR (rng ->> 1)::bigint IS NULL OR (rng ->> 2) IS NULL THEN
                    RAISE EXCEPTION 'unreadable';
                END IF;
                adding := adding || jsonb_build_object(
                    (rng ->> 0)::bigint::text, jsonb_build_array((rng ->> 1)::bigint, rng ->> 2, p.id, cutoff));
            END LOOP;
        EXCEPTION WHEN OTHERS THEN
            IF ok THEN
                ok := false; bad := p.id;
                problem := format('purge entry #%s does not say what it removed in a form the walk can read', p.id);
            END IF;
            CONTINUE;
        END;
        IF cutoff > p.at - interval '365 days' AND ok THEN
            ok := false; bad := p.id;
            problem := format('purge entry #%s removed entries younger than a year (cutoff %s)', p.id, cutoff);
        END IF;
        spans := spans || adding;
    END LOOP;

    FOR r IN
        SELECT coalesce(e.id, s.entry_id) AS entry_id, e.id IS NOT NULL AS present, s.seq, s.content_hash,
               s.prev_hash, s.hash,
               CASE WHEN e.id IS NOT NULL
                    THEN encode(sha256(convert_to({s}.goodput_audit_content(e), 'UTF8')), 'hex') END AS recomputed
          FROM {s}.compliance_auditentry e FULL JOIN {s}.compliance_auditseal s ON s.entry_id = e.id
         ORDER BY s.seq NULLS LAST, e.id
    LOOP
        n := n + 1;
        CONTINUE WHEN NOT ok;  -- count the rest; the first problem is the one named
        IF NOT r.present THEN
            ok := false; bad := r.entry_id;
            problem := format('entry #%s (seq %s) was removed: its seal is still there', r.entry_id, r.seq);
            CONTINUE;
        END IF;
        IF r.seq IS NULL THEN
            ok := false; bad := r.entry_id;
            problem := format('entry #%s was never sealed: it was written with the chain off', r.entry_id);
            CONTINUE;
        END IF;
        IF r.recomputed <> r.content_hash THEN
            ok := false; bad := r.entry_id;
            problem := format('entry #%s (seq %s) was changed after it was written: its content no longer '
                              'matches its content hash', r.entry_id, r.seq);
            CONTINUE;
        END IF;
        IF r.seq <> prev_seq + 1 THEN
            bridged := NULL;
            here := prev_seq + 1;
            WHILE here < r.seq LOOP
                span := spans -> here::text;
                IF span IS NULL OR (span ->> 0)::bigint >= r.seq THEN
                    bridged := NULL;
                    EXIT;
                END IF;
                here := (span ->> 0)::bigint + 1;
                bridged := span ->> 1;
            END LOOP;
            IF bridged IS NULL THEN
                ok := false; bad := r.entry_id;
                problem := format('entries with seq %s to %s, before entry #%s, are missing and no purge removed them',
                                  prev_seq + 1, r.seq - 1, r.entry_id);
                CONTINUE;
            END IF;
            prev_hash := bridged;
        END IF;
        IF r.prev_hash <> prev_hash THEN
            ok := false; bad := r.entry_id;
            problem := format('entry #%s (seq %s) does not follow %s: the hash it was chained to differs (an entry '
                              'before it was changed, removed or inserted)', r.entry_id, r.seq,
                              CASE WHEN prev_id IS NOT NULL AND r.seq = prev_seq + 1
                                   THEN format('entry #%s', prev_id) ELSE 'the chain' END);
            CONTINUE;
        END IF;
        IF encode(sha256(convert_to(r.prev_hash || r.content_hash, 'UTF8')), 'hex') <> r.hash THEN
            ok := false; bad := r.entry_id;
            problem := format('entry #%s (seq %s) carries a wrong chain hash', r.entry_id, r.seq);
            CONTINUE;
        END IF;
        IF r.seq = ANY (p_anchor_seqs) THEN
            found := found || jsonb_build_object(r.seq::text, r.hash);
        END IF;
        prev_seq := r.seq;
        prev_hash := r.hash;
        prev_id := r.entry_id;
    END LOOP;

    FOR i IN SELECT o FROM generate_subscripts(p_anchor_seqs, 1) o
              ORDER BY p_anchor_seqs[o], o LOOP
        EXIT WHEN NOT ok;
        a_seq := p_anchor_seqs[i];
        a_at := p_anchor_ats[i];
        IF found ? a_seq::text THEN
            CONTINUE WHEN found ->> a_seq::text = p_anchor_hashes[i];
            ok := false;
            problem := format('the earlier head seq %s with hash %s is not in the chain (seq %s has hash %s)',
                              a_seq, p_anchor_hashes[i], a_seq, found ->> a_seq::text);
            CONTINUE;
        END IF;
        -- Purged: the last entry of a range keeps its hash; one inside a range is fine only if the
        -- head was older than that purge's cutoff (a purge never reaches younger entries).
        SELECT x.value INTO span FROM jsonb_each(spans) x
         WHERE x.key::bigint <= a_seq AND (x.value ->> 0)::bigint >= a_seq LIMIT 1;
        IF span IS NOT NULL AND (span ->> 0)::bigint = a_seq THEN
            CONTINUE WHEN span ->> 1 = p_anchor_hashes[i];
            ok := false;
            problem := format('the earlier head seq %s with hash %s is not in the chain (seq %s has hash %s)',
                              a_seq, p_anchor_hashes[i], a_seq, span ->> 1);
            CONTINUE;
        END IF;
        CONTINUE WHEN span IS NOT NULL AND a_at IS NOT NULL AND a_at < (span ->> 3)::timestamptz;
        ok := false;
        problem := format('the earlier head seq %s with hash %s is not in the chain (seq %s %s)', a_seq,
                          p_anchor_hashes[i], a_seq,
                          CASE WHEN span IS NOT NULL THEN 'was purged inside a range' ELSE 'is missing' END);
    END LOOP;

    INSERT INTO {s}.compliance_auditchaincheck
        (checked_at, ok, entries, head_seq, head_hash, problem, first_bad_entry, duration_ms, triggered_by)
    VALUES (
        clock_timestamp(), ok, n, CASE WHEN prev_id IS NOT NULL THEN prev_seq END,
        CASE WHEN prev_id IS NOT NULL THEN prev_hash ELSE '' END, left(problem, 500), bad,
        least(extract(epoch FROM clock_timestamp() - started) * 1000, 2147483647)::integer,
        left(coalesce(p_triggered_by, ''), 100)
    )
    RETURNING id INTO check_id;
    RETURN check_id;
END
$$;

REVOKE EXECUTE ON FUNCTION {s}.goodput_audit_verify(bigint[], text[], timestamptz[], text) FROM PUBLIC;
"""

REVERSE = """
DROP FUNCTION {s}.goodput_audit_verify(bigint[], text[], timestamptz[], text);
"""


def _schema(schema_editor) -> str:
    with schema_editor.connection.cursor() as cursor:
        cursor.execute("SELECT current_schema()")
        schema = cursor.fetchone()[0]
    if not re.fullmatch(r"[a-z_][a-z0-9_]*", schema):
        raise ValueError(f"schema {schema!r}: the console's functions expect a plain schema name")
    return schema


def forwards(apps, schema_editor) -> None:
    with schema_editor.connection.cursor() as cursor:
        cursor.execute(SQL.replace("{s}", _schema(schema_editor)).replace("{lock}", str(SEAL_LOCK)))


def backwards(apps, schema_editor) -> None:
    # The pinned paths and qualified names stay: 0006's versions are what this migration fixed.
    with schema_editor.connection.cursor() as cursor:
        cursor.execute(REVERSE.replace("{s}", _schema(schema_editor)))


class Migration(migrations.Migration):
    dependencies = [
        ("compliance", "0008_recovery_job_copy_schedule"),
        ("incidents", "0007_incident_gpus_out_of_service"),
    ]

    operations = [migrations.RunPython(forwards, backwards)]
