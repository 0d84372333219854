"""One run's transaction: load, settle, reconcile, coverage and the audit row, against the tables and
in the SQL of the dialects (docs/architecture.md, "Inside warehouse/")."""
