-- airflow-provider-bos: destination tables for DuckDB (1.1 or newer).
-- Kept in step with airflow_provider_bos/warehouse/tables/schema.py (tests/warehouse/test_ddl.py compares them).
-- The operator creates these itself when missing; run this file when a DBA creates them instead.
-- Timestamps are TIMESTAMPTZ (instants; shown in the session's TimeZone). JSON columns are DuckDB's JSON.
-- _bos_record_hash = sha256 hex of the record's canonical JSON. DuckDB ignores VARCHAR lengths: none are given.
-- One writer process per database file (see docs/destinations.md).

CREATE TABLE IF NOT EXISTS bos_records (
    record_ref        VARCHAR NOT NULL,
    display_name      VARCHAR,
    email             VARCHAR,
    phone             VARCHAR,
    lifecycle         JSON,
    identity_match    JSON,
    attributes        JSON NOT NULL,
    sources           JSON NOT NULL,
    _bos_observed_at  TIMESTAMPTZ NOT NULL,
    _bos_synced_at    TIMESTAMPTZ NOT NULL,
    _bos_run_id       VARCHAR NOT NULL,
    _bos_record_hash  VARCHAR NOT NULL,
    -- sha256 hex of the record's bytes as received: re-runs skip byte-identical records.
    -- Tables made before it: ALTER TABLE bos_records ADD COLUMN _bos_wire_hash VARCHAR;
    _bos_wire_hash    VARCHAR,
    -- NULL while the row is current; set when a run retired it (a complete full read did not return
    -- it, or it was superseded by the record named in _bos_superseded_by). Tables made before them:
    -- the writer adds both, or run ALTER TABLE bos_records ADD COLUMN _bos_deleted_at TIMESTAMPTZ;
    -- and ALTER TABLE bos_records ADD COLUMN _bos_superseded_by VARCHAR;
    _bos_deleted_at   TIMESTAMPTZ,
    _bos_superseded_by VARCHAR,
    PRIMARY KEY (record_ref)
);

CREATE TABLE IF NOT EXISTS bos_sync_runs (
    run_id               VARCHAR NOT NULL,
    dag_id               VARCHAR,
    task_id              VARCHAR,
    airflow_run_id       VARCHAR,
    conn_id              VARCHAR,
    context_handle       VARCHAR,
    tool_name            VARCHAR,
    arguments_hash       VARCHAR,
    started_at           TIMESTAMPTZ,
    finished_at          TIMESTAMPTZ NOT NULL,
    status               VARCHAR NOT NULL,   -- complete | partial | failed
    completeness         VARCHAR,
    result_count         BIGINT,
    inserted             BIGINT,
    updated              BIGINT,
    unchanged            BIGINT,
    skipped_stale        BIGINT,
    duplicates           BIGINT,
    -- records quarantined in <table>_rejects (invalid_records="quarantine").
    -- Tables made before it: the writer adds it, or run ALTER TABLE bos_sync_runs ADD COLUMN rejected BIGINT;
    rejected             BIGINT,
    -- rows retired (not returned by a complete full read) and superseded (merged or split into other
    -- records of a complete result); scope: sha256 of the read's scope (see docs/sync-modes.md).
    -- Tables made before them: the writer adds them, or ALTER TABLE bos_sync_runs ADD COLUMN retired BIGINT;
    -- (superseded BIGINT, scope VARCHAR likewise).
    retired              BIGINT,
    superseded           BIGINT,
    scope                VARCHAR,
    -- withheld: records of a partial read under refs a complete read merged away (not revived);
    -- confirmed_at: a complete full read's read time (it confirmed every current row of its scope).
    -- Tables made before them: the writer adds them, or ALTER TABLE bos_sync_runs ADD COLUMN withheld BIGINT;
    -- (confirmed_at TIMESTAMPTZ likewise).
    withheld             BIGINT,
    confirmed_at         TIMESTAMPTZ,
    -- coverage: how many of the run's records had a value in each watched column, as JSON
    -- {"records": N, "columns": {"email": n, ...}} (NULL for a failed run; docs/warehouse.md).
    -- Tables made before it: the writer adds it, or ALTER TABLE bos_sync_runs ADD COLUMN coverage JSON;
    coverage             JSON,
    -- notes: what the run says for information (a re-hash, the policy's report, what a guard held
    -- back); error_message holds only why a run failed or is partial. Tables made before it: the
    -- writer adds it, or ALTER TABLE bos_sync_runs ADD COLUMN notes VARCHAR;
    notes                VARCHAR,
    provisional_records  BIGINT,
    provisional_pages    BIGINT,
    source_errors        JSON,
    source_summary       JSON,
    error_message        VARCHAR,
    destination_table    VARCHAR,
    PRIMARY KEY (run_id)
);

CREATE INDEX IF NOT EXISTS ix_bos_sync_runs_lookup
    ON bos_sync_runs (conn_id, context_handle, tool_name, finished_at);

-- Only with invalid_records="quarantine": records bos_records cannot store (one table per records
-- table, named <table>_rejects). record: the record's JSON bytes, at most 64 KiB (truncated: cut).
CREATE TABLE IF NOT EXISTS bos_records_rejects (
    run_id       VARCHAR NOT NULL,
    record_ref   VARCHAR,
    reason       VARCHAR NOT NULL,
    record       BLOB NOT NULL,
    truncated    BOOLEAN NOT NULL,
    rejected_at  TIMESTAMPTZ NOT NULL
);

CREATE INDEX IF NOT EXISTS ix_bos_records_rejects_run ON bos_records_rejects (run_id);

-- Retirements a complete full read held for a person to decide (on_retire_guard='ask': they
-- passed max_retire_fraction): one row per held record_ref and run; created by the first such run.
CREATE TABLE IF NOT EXISTS bos_records_pending_retirements (
    run_id      VARCHAR NOT NULL,
    record_ref  VARCHAR NOT NULL,
    scope       VARCHAR NOT NULL,
    read_at     TIMESTAMPTZ NOT NULL,
    held_at     TIMESTAMPTZ NOT NULL,
    scope_rows  BIGINT,
    PRIMARY KEY (run_id, record_ref)
);

-- Who was merged into whom: one row per (superseded record_ref, successor record_ref) and run
-- (a merge: several rows with one successor_ref; a split: several with one record_ref).
CREATE TABLE IF NOT EXISTS bos_records_lineage (
    run_id         VARCHAR NOT NULL,
    record_ref     VARCHAR NOT NULL,
    successor_ref  VARCHAR NOT NULL,
    recorded_at    TIMESTAMPTZ NOT NULL
);

CREATE INDEX IF NOT EXISTS ix_bos_records_lineage_ref ON bos_records_lineage (record_ref);
CREATE INDEX IF NOT EXISTS ix_bos_records_lineage_successor ON bos_records_lineage (successor_ref);

-- One row per provenance entry of every row of bos_records (entry_index: its place in the
-- record's sources array). is_current: the record is current (false once retired or superseded).
-- Kept by every run in the run's transaction; built from the sources column by the first run on a
-- table stored before it.
-- No key on DuckDB: its unique indexes refuse a key deleted and inserted again in one transaction.
CREATE TABLE IF NOT EXISTS bos_records_sources (
    record_ref      VARCHAR NOT NULL,
    entry_index     BIGINT NOT NULL,
    source_type     VARCHAR,
    source_identity VARCHAR,
    external_id     VARCHAR,
    record_type     VARCHAR,
    version         VARCHAR,
    capabilities    JSON,
    is_current      BOOLEAN NOT NULL
);

-- No entry index on DuckDB: its planner uses an index only for a predicate on that index's one
-- column, never for (source_type, source_identity, external_id); its zone maps answer the look-up.

-- Only with history=True: every version of every record (SCD2); _bos_valid_to NULL = the current one.
CREATE TABLE IF NOT EXISTS bos_records_history (
    record_ref        VARCHAR NOT NULL,
    display_name      VARCHAR,
    email             VARCHAR,
    phone             VARCHAR,
    lifecycle         JSON,
    identity_match    JSON,
    attributes        JSON NOT NULL,
    sources           JSON NOT NULL,
    _bos_observed_at  TIMESTAMPTZ NOT NULL,
    _bos_record_hash  VARCHAR NOT NULL,
    _bos_valid_from   TIMESTAMPTZ NOT NULL,
    _bos_valid_to     TIMESTAMPTZ,
    _bos_run_id       VARCHAR NOT NULL,
    PRIMARY KEY (record_ref, _bos_valid_from)
);

CREATE INDEX IF NOT EXISTS ix_bos_records_history_run ON bos_records_history (_bos_run_id);

-- Only for a table written under a personal-data policy (pii_policy): the policy's fingerprint, one
-- row (the canonical rules, the hash recipe's version and the key's public id; never the key). A run
-- with another policy or key is refused before it reads (see docs/personal-data.md).
CREATE TABLE IF NOT EXISTS bos_records_policy (
    fingerprint  VARCHAR NOT NULL,
    set_at       TIMESTAMPTZ NOT NULL,
    run_id       VARCHAR
);

-- Only with attribute_columns (promoted attributes, see docs/warehouse.md): one row per promoted
-- column the records table is filled for (policy: SHA-256 of the personal-data policy fingerprint the
-- stored attributes were under, NULL: none). A configured column without its matching row here (new,
-- re-mapped, configured again after runs without it, or a policy applied since) is filled from the
-- stored attributes by the next run.
CREATE TABLE IF NOT EXISTS bos_records_columns (
    column_name  VARCHAR NOT NULL,
    path         VARCHAR NOT NULL,
    type         VARCHAR(16) NOT NULL,
    policy       VARCHAR,
    filled_at    TIMESTAMPTZ NOT NULL,
    run_id       VARCHAR,
    PRIMARY KEY (column_name)
);

-- The columns themselves: the first run that configures one adds it to bos_records (and
-- bos_records_history, if it exists), nullable, with the type of its kind, as below (one example
-- per type; tests/warehouse/test_promoted_ddl.py checks each against what the writer adds):
-- promoted text: ALTER TABLE bos_records ADD COLUMN department VARCHAR;
-- promoted text: ALTER TABLE bos_records_history ADD COLUMN department VARCHAR;
-- promoted integer: ALTER TABLE bos_records ADD COLUMN grade BIGINT;
-- promoted integer: ALTER TABLE bos_records_history ADD COLUMN grade BIGINT;
-- promoted number: ALTER TABLE bos_records ADD COLUMN fte DOUBLE;
-- promoted number: ALTER TABLE bos_records_history ADD COLUMN fte DOUBLE;
-- promoted boolean: ALTER TABLE bos_records ADD COLUMN is_manager BOOLEAN;
-- promoted boolean: ALTER TABLE bos_records_history ADD COLUMN is_manager BOOLEAN;
-- promoted timestamp: ALTER TABLE bos_records ADD COLUMN hired_at TIMESTAMPTZ;
-- promoted timestamp: ALTER TABLE bos_records_history ADD COLUMN hired_at TIMESTAMPTZ;
-- promoted json: ALTER TABLE bos_records ADD COLUMN tags JSON;
-- promoted json: ALTER TABLE bos_records_history ADD COLUMN tags JSON;
