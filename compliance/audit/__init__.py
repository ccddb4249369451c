"""The audit log: every change to a compliance record, its hash chain and its heads kept outside the database.

The area's pages, forms and API sit here under the names every fleet room uses; its models stay in
``compliance.models.audit`` and its commands and reads in ``compliance.services``."""
