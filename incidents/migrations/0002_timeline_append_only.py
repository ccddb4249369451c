"""Timeline entries are append-only in the database itself, not only in the model's save()."""

from django.db import migrations

SQL = """
CREATE FUNCTION incidents_timeline_append_only() RETURNS trigger AS $$
BEGIN
    RAISE EXCEPTION 'incident timeline entries are append-only (% refused)', TG_OP;
END;
$$ LANGUAGE plpgsql;

CREATE TRIGGER incidents_timelineentry_append_only
    BEFORE UPDATE OR DELETE ON incidents_timelineentry
    FOR EACH ROW EXECUTE FUNCTION incidents_timeline_append_only();
"""

REVERSE = """
DROP TRIGGER incidents_timelineentry_append_only ON incidents_timelineentry;
DROP FUNCTION incidents_timeline_append_only();
"""


class Migration(migrations.Migration):
    dependencies = [("incidents", "0001_initial")]

    operations = [migrations.RunSQL(SQL, REVERSE)]
