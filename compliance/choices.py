"""The compliance register's vocabularies, named as the AI Office template and the GDPR name them."""

from __future__ import annotations

from django.db import models


class Modality(models.TextChoices):
    TEXT = "text", "Text"
    IMAGE = "image", "Image"
    AUDIO = "audio", "Audio"
    VIDEO = "video", "Video"
    OTHER = "other", "Other"


class SourceCategory(models.TextChoices):
    """Section 2 of the training-content summary template (AI Office, July 2025)."""

    PUBLIC = "public", "2.1 Publicly available datasets"
    LICENSED = "licensed", "2.2.1 Private: licensed from rightsholders"
    THIRD_PARTY = "third_party", "2.2.2 Private: obtained from other third parties"
    CRAWLED = "crawled", "2.3 Crawled and scraped online"
    USER_DATA = "user_data", "2.4 User data"
    SYNTHETIC = "synthetic", "2.5 Synthetic data"
    OTHER = "other", "2.6 Other sources"


class SizeUnit(models.TextChoices):
    """The unit a dataset's size is counted in; the template's ranges are per modality in tokens
    (text), items (images) or hours (audio, video)."""

    TOKENS = "tokens", "tokens"
    IMAGES = "images", "images"
    HOURS = "hours", "hours"
    ITEMS = "items", "items"
    BYTES = "bytes", "bytes"


class LawfulBasis(models.TextChoices):
    """GDPR Art. 6(1)."""

    CONSENT = "consent", "(a) consent"
    CONTRACT = "contract", "(b) contract"
    LEGAL_OBLIGATION = "legal_obligation", "(c) legal obligation"
    VITAL_INTERESTS = "vital_interests", "(d) vital interests"
    PUBLIC_TASK = "public_task", "(e) public task"
    LEGITIMATE_INTERESTS = "legitimate_interests", "(f) legitimate interests"


class WeightsClassification(models.TextChoices):
    PUBLIC = "public", "Public (open weights)"
    INTERNAL = "internal", "Internal"
    CONFIDENTIAL = "confidential", "Confidential"
    TRADE_SECRET = "trade_secret", "Trade secret"


class DataClass(models.TextChoices):
    """What a retention policy or a record of processing is about. The first three are the
    platform's data (the console holds none of them); the rest are the console's own records."""

    TRAINING_CORPUS = "training_corpus", "Training corpora"
    INFERENCE_CONTENT = "inference_content", "Inference prompts and outputs"
    MODEL_WEIGHTS = "model_weights", "Model weights"
    TELEMETRY = "telemetry", "GPU telemetry (samples and rollups)"
    SERVING_SAMPLES = "serving_samples", "Serving metric samples"
    INCIDENTS = "incidents", "Incidents and their timelines"
    AUDIT = "audit", "Audit log entries"


# The classes whose data lives in the console's database: a policy on them is enforced by the
# retention task. A policy on any other class is an attestation with an owner and a review date.
CONSOLE_HELD = frozenset({DataClass.TELEMETRY, DataClass.SERVING_SAMPLES, DataClass.INCIDENTS, DataClass.AUDIT})


class RetentionAction(models.TextChoices):
    DELETE = "delete", "Delete"
    ANONYMISE = "anonymise", "Anonymise"


class RequestKind(models.TextChoices):
    """The data subject's rights (GDPR Arts. 15-22), each a request the controller must answer
    within one month of receipt (Art. 12(3))."""

    ACCESS = "access", "Access (Art. 15)"
    RECTIFICATION = "rectification", "Rectification (Art. 16)"
    ERASURE = "erasure", "Erasure (Art. 17)"
    RESTRICTION = "restriction", "Restriction of processing (Art. 18)"
    NOTIFICATION = "notification", "Notification of recipients (Art. 19)"
    PORTABILITY = "portability", "Data portability (Art. 20)"
    OBJECTION = "objection", "Objection (Art. 21)"
    AUTOMATED_DECISION = "automated_decision", "Automated decision-making (Art. 22)"


class UserDataOrigin(models.TextChoices):
    """Section 2.4 of the summary template asks two questions about user data: this says which
    one a user-data dataset answers."""

    MODEL = "model", "User interactions with the AI model"
    OTHER_SERVICES = "other_services", "User interactions with the provider's other services or products"


class RequestStatus(models.TextChoices):
    OPEN = "open", "Open"
    IN_PROGRESS = "in_progress", "In progress"
    COMPLETED = "completed", "Completed"
    REFUSED = "refused", "Refused"
    # Closed unanswered by its correction, the new request that carries it on (issue 37): set by
    # compliance.services.gdpr.log_request only, never by hand.
    CORRECTED = "corrected", "Corrected"


OPEN_REQUEST_STATES = (RequestStatus.OPEN, RequestStatus.IN_PROGRESS)


class AuditAction(models.TextChoices):
    CREATE = "create", "Create"
    UPDATE = "update", "Update"
    DELETE = "delete", "Delete"
    EXPORT = "export", "Export"  # a download of a compliance document
    ACTION = "action", "Action"  # anything else worth a line: a publish, a retention run
    PURGE = "purge", "Purge"  # written by the database's purge function itself, never by the app
    SIGN_IN = "sign_in", "Sign-in"
    SIGN_OUT = "sign_out", "Sign-out"
    SIGN_IN_FAILED = "sign_in_failed", "Failed sign-in"
    LOCKOUT = "lockout", "Lock-out"


class PackStatus(models.TextChoices):
    QUEUED = "queued", "Queued"
    RUNNING = "running", "Running"
    DONE = "done", "Done"
    FAILED = "failed", "Failed"


class RecoveryKind(models.TextChoices):
    """What must survive the loss of a site or a storage tier (issue 26, "Recovery")."""

    DATASET = "dataset", "Dataset"
    CHECKPOINTS = "checkpoints", "Checkpoints"
    MODEL_WEIGHTS = "model_weights", "Model weights"
    CONSOLE_DATABASE = "console_database", "Console database"


class BackupMethod(models.TextChoices):
    SNAPSHOT = "snapshot", "Snapshot"
    REPLICATION = "replication", "Replication"
    OBJECT_STORE_VERSIONING = "object_store_versioning", "Object-store versioning"
    VELERO = "velero", "Velero"
    CSI_SNAPSHOT = "csi_snapshot", "CSI volume snapshot"
    MANAGE_PY_BACKUP = "manage_py_backup", "manage.py backup"


class BackupOutcome(models.TextChoices):
    SUCCESS = "success", "Success"
    FAILED = "failed", "Failed"
    PARTIAL = "partial", "Partial"


class RecoveryState(models.TextChoices):
    """What the register says of an item now (compliance.services.recovery.problems): the same
    rules as its findings, worst first."""

    FAILING = "failing", "Backups failing"
    RPO_BREACHED = "rpo_breached", "RPO breached"
    SAME_SITE = "same_site", "Copy on the same site"
    RTO_UNPROVEN = "rto_unproven", "RTO unproven"
    OK = "ok", "OK"
