"""Issue 22, items 4-8: every data-subject right with extensions and completion dates; the Art. 30
controller fields apart and processor records; the training-content summary's questions one by
one (not-applicable facts, content types per modality, continuous training, 2.2.2's publicly known
datasets, 2.4's two questions, 2.5's two kinds of generating models, the optional comments).

The old single content-type answer described the whole model: it is copied to each modality the
model names (to text when it names none), so nothing an officer wrote is lost.
"""

from django.db import migrations, models
from django.db.models import F, Q

MODALITY_COLUMNS = ("text", "image", "audio", "video", "other")


def split_content_types(apps, schema_editor):  # type: ignore[no-untyped-def]
    GpaiModel = apps.get_model("compliance", "GpaiModel")
    for model in GpaiModel.objects.exclude(content_types=""):
        for modality in [m for m in model.modalities if m in MODALITY_COLUMNS] or ["text"]:
            setattr(model, f"content_types_{modality}", model.content_types)
        model.save(update_fields=[f"content_types_{m}" for m in MODALITY_COLUMNS])


def join_content_types(apps, schema_editor):  # type: ignore[no-untyped-def]
    GpaiModel = apps.get_model("compliance", "GpaiModel")
    for model in GpaiModel.objects.all():
        texts = [getattr(model, f"content_types_{m}") for m in MODALITY_COLUMNS]
        model.content_types = "; ".join(dict.fromkeys(t for t in texts if t))
        model.save(update_fields=["content_types"])


def _text(help_text: str, **kwargs):  # type: ignore[no-untyped-def]
    return models.TextField(blank=True, help_text=help_text, **kwargs)


class Migration(migrations.Migration):
    dependencies = [("compliance", "0003_retention_incident_purge")]

    operations = [
        # --- data-subject requests (items 4-6) ---
        migrations.AlterField(
            model_name="subjectrequest",
            name="kind",
            field=models.CharField(
                choices=[
                    ("access", "Access (Art. 15)"),
                    ("rectification", "Rectification (Art. 16)"),
                    ("erasure", "Erasure (Art. 17)"),
                    ("restriction", "Restriction of processing (Art. 18)"),
                    ("notification", "Notification of recipients (Art. 19)"),
                    ("portability", "Data portability (Art. 20)"),
                    ("objection", "Objection (Art. 21)"),
                    ("automated_decision", "Automated decision-making (Art. 22)"),
                ],
                max_length=24,
            ),
        ),
        migrations.AddField(
            model_name="subjectrequest",
            name="extension_reason",
            field=_text("Why two further months are necessary"),
        ),
        migrations.AddField(
            model_name="subjectrequest",
            name="extension_notified_on",
            field=models.DateField(
                blank=True, help_text="When the data subject was told of the extension and its reasons", null=True
            ),
        ),
        migrations.AlterField(
            model_name="subjectrequest",
            name="closed_on",
            field=models.DateField(blank=True, help_text="When the request was answered or refused", null=True),
        ),
        migrations.AddConstraint(
            model_name="subjectrequest",
            constraint=models.CheckConstraint(
                condition=Q(extension_reason="", extension_notified_on__isnull=True)
                | (~Q(extension_reason="") & Q(extension_notified_on__isnull=False)),
                name="subjectrequest_extension_complete",
            ),
        ),
        migrations.AddConstraint(
            model_name="subjectrequest",
            constraint=models.CheckConstraint(
                condition=Q(closed_on__isnull=True) | Q(closed_on__gte=F("received_on")),
                name="subjectrequest_closed_after_receipt",
            ),
        ),
        # --- records of processing (item 7) ---
        migrations.RenameField(model_name="dataasset", old_name="controller_contact", new_name="controller"),
        migrations.AlterField(
            model_name="dataasset",
            name="controller",
            field=models.CharField(help_text="Name and contact details of the controller", max_length=300),
        ),
        migrations.AddField(
            model_name="dataasset",
            name="joint_controller",
            field=models.CharField(
                blank=True, help_text="Name and contact details of any joint controller (Art. 26)", max_length=300
            ),
        ),
        migrations.AddField(
            model_name="dataasset",
            name="representative",
            field=models.CharField(
                blank=True,
                help_text="The controller's representative in the Union, where one is required (Art. 27)",
                max_length=300,
            ),
        ),
        migrations.AddField(
            model_name="dataasset",
            name="data_protection_officer",
            field=models.CharField(
                blank=True, help_text="Name and contact details of the data protection officer", max_length=300
            ),
        ),
        migrations.CreateModel(
            name="ProcessorRecord",
            fields=[
                ("id", models.BigAutoField(auto_created=True, primary_key=True, serialize=False, verbose_name="ID")),
                ("name", models.CharField(help_text="The processing activity", max_length=200, unique=True)),
                (
                    "processor",
                    models.CharField(help_text="Name and contact details of the processor", max_length=300),
                ),
                (
                    "controllers",
                    models.TextField(
                        help_text="Name and contact details of each controller on whose behalf the processor acts"
                    ),
                ),
                (
                    "representative",
                    models.CharField(
                        blank=True,
                        help_text="The processor's or the controller's representative, where applicable",
                        max_length=300,
                    ),
                ),
                (
                    "data_protection_officer",
                    models.CharField(
                        blank=True, help_text="Name and contact details of the data protection officer", max_length=300
                    ),
                ),
                (
                    "processing_categories",
                    models.TextField(help_text="Categories of processing carried out for each controller"),
                ),
                (
                    "third_country_transfers",
                    _text("Transfers to a third country or international organisation, and their safeguards"),
                ),
                ("security_measures", _text("Technical and organisational measures (Art. 32(1))")),
                ("created_at", models.DateTimeField(auto_now_add=True)),
                ("updated_at", models.DateTimeField(auto_now=True)),
            ],
            options={
                "verbose_name": "processor record",
                "verbose_name_plural": "processor records",
                "ordering": ["name"],
            },
        ),
        # --- the summary template, question by question (item 8) ---
        migrations.AddField(
            model_name="gpaimodel",
            name="provider_established_in_union",
            field=models.BooleanField(
                blank=True, help_text="Established in the Union: no authorised representative (Art. 54)", null=True
            ),
        ),
        migrations.AddField(
            model_name="gpaimodel",
            name="trained_from_scratch",
            field=models.BooleanField(
                blank=True,
                help_text="Not a modification or fine-tune of another model: no model dependencies",
                null=True,
            ),
        ),
        migrations.AddField(
            model_name="gpaimodel", name="content_types_text", field=_text("Types of content of the text")
        ),
        migrations.AddField(
            model_name="gpaimodel", name="content_types_image", field=_text("Types of content of the images")
        ),
        migrations.AddField(
            model_name="gpaimodel", name="content_types_audio", field=_text("Types of content of the audio")
        ),
        migrations.AddField(
            model_name="gpaimodel", name="content_types_video", field=_text("Types of content of the video")
        ),
        migrations.AddField(
            model_name="gpaimodel",
            name="content_types_other",
            field=_text("Types of content of the other modality"),
        ),
        migrations.RunPython(split_content_types, join_content_types),
        migrations.RemoveField(model_name="gpaimodel", name="content_types"),
        migrations.AddField(
            model_name="gpaimodel",
            name="other_modality",
            field=models.CharField(blank=True, help_text='What the "other" modality is', max_length=200),
        ),
        migrations.AddField(
            model_name="gpaimodel",
            name="continuously_trained",
            field=models.BooleanField(
                blank=True, help_text="Trained on new data after the latest date of data collection", null=True
            ),
        ),
        migrations.AddField(model_name="gpaimodel", name="comments_general", field=_text("1.3 Additional comments")),
        migrations.AddField(model_name="gpaimodel", name="comments_public", field=_text("2.1 Additional comments")),
        migrations.AddField(
            model_name="gpaimodel", name="comments_third_party", field=_text("2.2.2 Additional comments")
        ),
        migrations.AddField(model_name="gpaimodel", name="comments_crawled", field=_text("2.3 Additional comments")),
        migrations.AddField(model_name="gpaimodel", name="comments_user_data", field=_text("2.4 Additional comments")),
        migrations.AddField(model_name="gpaimodel", name="comments_synthetic", field=_text("2.5 Additional comments")),
        migrations.AddField(
            model_name="gpaimodel", name="comments_other_sources", field=_text("2.6 Additional comments")
        ),
        migrations.AddField(model_name="gpaimodel", name="comments_tdm", field=_text("3.1 Additional comments")),
        migrations.AddConstraint(
            model_name="gpaimodel",
            constraint=models.CheckConstraint(
                condition=~Q(trained_from_scratch=True) | (Q(base_model__isnull=True) & Q(base_model_external="")),
                name="gpaimodel_scratch_has_no_base",
            ),
        ),
        migrations.AddField(
            model_name="dataset",
            name="publicly_known",
            field=models.BooleanField(
                default=False, help_text="2.2.2: a private dataset whose name is publicly known, listed by name"
            ),
        ),
        migrations.AddField(
            model_name="dataset",
            name="user_data_origin",
            field=models.CharField(
                blank=True,
                choices=[
                    ("model", "User interactions with the AI model"),
                    ("other_services", "User interactions with the provider's other services or products"),
                ],
                help_text="2.4: which of the two questions it answers",
                max_length=16,
            ),
        ),
        migrations.AlterField(
            model_name="dataset",
            name="user_data_source",
            field=models.CharField(
                blank=True, help_text="The services or products the user data was collected from", max_length=300
            ),
        ),
        migrations.AlterField(
            model_name="dataset",
            name="generated_by",
            field=models.CharField(
                blank=True,
                help_text="General-purpose models on the market that generated synthetic data",
                max_length=300,
            ),
        ),
        migrations.AddField(
            model_name="dataset",
            name="generated_by_other",
            field=models.CharField(
                blank=True,
                help_text="Other models that generated it, including the provider's own not on the market",
                max_length=300,
            ),
        ),
    ]
