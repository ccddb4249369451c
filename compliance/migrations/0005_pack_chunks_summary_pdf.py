"""Heavy work stays bounded (issue 22, items 11 and 12).

- A pack's zip moves from one bytea column (written and read whole) to numbered chunks of at most
  1 MiB, written and streamed one at a time; the zips already built are copied over first.
- A published summary's PDF is rendered once, by a worker, and stored; the row is frozen like the
  version it renders (the trigger function of migration 0002).
"""

import django.db.models.deletion
from django.db import migrations, models

CHUNK_BYTES = 1024 * 1024

FREEZE_PDF = """
CREATE TRIGGER summarypdf_frozen BEFORE UPDATE OR DELETE ON compliance_summarypdf
    FOR EACH ROW EXECUTE FUNCTION goodput_refuse_change('frozen');
"""
UNFREEZE_PDF = "DROP TRIGGER IF EXISTS summarypdf_frozen ON compliance_summarypdf;"


def copy_zips_to_chunks(apps, schema_editor):
    Pack = apps.get_model("compliance", "CompliancePack")
    Chunk = apps.get_model("compliance", "CompliancePackChunk")
    for pk in Pack.objects.filter(content__isnull=False).values_list("pk", flat=True).iterator():
        content = bytes(Pack.objects.values_list("content", flat=True).get(pk=pk))
        for seq, offset in enumerate(range(0, len(content), CHUNK_BYTES)):
            Chunk.objects.create(pack_id=pk, seq=seq, data=content[offset : offset + CHUNK_BYTES])


def copy_chunks_to_zips(apps, schema_editor):
    Pack = apps.get_model("compliance", "CompliancePack")
    Chunk = apps.get_model("compliance", "CompliancePackChunk")
    for pk in Chunk.objects.values_list("pack_id", flat=True).distinct():
        content = b"".join(
            bytes(d) for d in Chunk.objects.filter(pack_id=pk).order_by("seq").values_list("data", flat=True)
        )
        Pack.objects.filter(pk=pk).update(content=content)


class Migration(migrations.Migration):
    dependencies = [("compliance", "0004_subject_rights_processors_template")]

    operations = [
        migrations.CreateModel(
            name="CompliancePackChunk",
            fields=[
                ("id", models.BigAutoField(auto_created=True, primary_key=True, serialize=False, verbose_name="ID")),
                ("seq", models.PositiveIntegerField()),
                ("data", models.BinaryField()),
                (
                    "pack",
                    models.ForeignKey(
                        on_delete=django.db.models.deletion.CASCADE,
                        related_name="chunks",
                        to="compliance.compliancepack",
                    ),
                ),
            ],
            options={
                "constraints": [models.UniqueConstraint(fields=("pack", "seq"), name="compliancepackchunk_unique")],
            },
        ),
        migrations.RunPython(copy_zips_to_chunks, copy_chunks_to_zips),
        migrations.RemoveField(model_name="compliancepack", name="content"),
        migrations.CreateModel(
            name="SummaryPdf",
            fields=[
                (
                    "summary",
                    models.OneToOneField(
                        on_delete=django.db.models.deletion.PROTECT,
                        primary_key=True,
                        related_name="pdf",
                        serialize=False,
                        to="compliance.summaryversion",
                    ),
                ),
                ("content", models.BinaryField()),
                ("sha256", models.CharField(max_length=64)),
                ("size", models.PositiveIntegerField()),
                ("render_ms", models.PositiveIntegerField(help_text="How long the worker took to render it")),
                ("rendered_at", models.DateTimeField(auto_now_add=True)),
            ],
            options={"verbose_name": "summary PDF"},
        ),
        migrations.RunSQL(FREEZE_PDF, UNFREEZE_PDF),
    ]
