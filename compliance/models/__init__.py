from compliance.models.audit import AuditEntry
from compliance.models.gdpr import DataAsset, SubjectRequest, one_month_after
from compliance.models.pack import CompliancePack
from compliance.models.register import SYSTEMIC_RISK_FLOP, CrawledDomain, Dataset, GpaiModel, Lineage
from compliance.models.retention import LegalHold, RetentionPolicy, RetentionRun
from compliance.models.summary import SummaryVersion

__all__ = [
    "SYSTEMIC_RISK_FLOP",
    "AuditEntry",
    "CompliancePack",
    "CrawledDomain",
    "DataAsset",
    "Dataset",
    "GpaiModel",
    "LegalHold",
    "Lineage",
    "RetentionPolicy",
    "RetentionRun",
    "SubjectRequest",
    "SummaryVersion",
    "one_month_after",
]
