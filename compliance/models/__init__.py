from compliance.models.audit import GENESIS_HASH, AuditChainCheck, AuditEntry, AuditSeal
from compliance.models.gdpr import DataAsset, ProcessorRecord, SubjectRequest, one_month_after
from compliance.models.pack import CompliancePack, CompliancePackChunk
from compliance.models.recovery import RECOVERY_DEFAULTS, BackupReport, RecoveryItem, RestoreTest
from compliance.models.register import SYSTEMIC_RISK_FLOP, CrawledDomain, Dataset, GpaiModel, Lineage
from compliance.models.retention import LegalHold, RetentionPolicy, RetentionRun
from compliance.models.summary import SummaryVersion
from compliance.models.summary_pdf import SummaryPdf

__all__ = [
    "GENESIS_HASH",
    "RECOVERY_DEFAULTS",
    "SYSTEMIC_RISK_FLOP",
    "AuditChainCheck",
    "AuditEntry",
    "AuditSeal",
    "BackupReport",
    "CompliancePack",
    "CompliancePackChunk",
    "CrawledDomain",
    "DataAsset",
    "Dataset",
    "GpaiModel",
    "LegalHold",
    "Lineage",
    "ProcessorRecord",
    "RecoveryItem",
    "RestoreTest",
    "RetentionPolicy",
    "RetentionRun",
    "SubjectRequest",
    "SummaryPdf",
    "SummaryVersion",
    "one_month_after",
]
