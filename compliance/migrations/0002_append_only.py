"""Append-only tables, enforced by the database so that no path (the app, the API, the admin, a
plain ORM call, a psql session as the app's role) can change what was written.

- compliance_auditentry: UPDATE is refused; DELETE is refused unless the transaction set
  ``goodput.audit_purge`` to 'on' (SET LOCAL, done only by the retention task applying the audit
  policy, whose run is itself recorded).
- compliance_summaryversion: a published summary is frozen; UPDATE and DELETE are refused.

TRUNCATE is not an ORM operation (only a test suite's flush issues it); a production deployment
revokes it from the console's role (docs/compliance.md, audit log).
"""

from django.db import migrations

SQL = """
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
CREATE TRIGGER summaryversion_frozen BEFORE UPDATE OR DELETE ON compliance_summaryversion
    FOR EACH ROW EXECUTE FUNCTION goodput_refuse_change('frozen');
"""

REVERSE = """
DROP TRIGGER IF EXISTS auditentry_append_only ON compliance_auditentry;
DROP TRIGGER IF EXISTS summaryversion_frozen ON compliance_summaryversion;
DROP FUNCTION IF EXISTS goodput_refuse_change();
"""


class Migration(migrations.Migration):
    dependencies = [("compliance", "0001_register")]

    operations = [migrations.RunSQL(SQL, REVERSE)]
