-- airflow-provider-bos: destination tables for Snowflake.
-- Kept in step with airflow_provider_bos/warehouse/tables/schema.py (tests/warehouse/test_snowflake_ddl.py
-- compares them). The operator creates these itself when missing; run this file when a DBA creates
-- them instead, in the database and schema of the bos_warehouse connection.
-- Names are unquoted, so Snowflake stores them upper-cased (BOS_RECORDS, RECORD_REF): the operator's
-- destination_table="bos_records" is this table. Timestamps are TIMESTAMP_TZ (written in UTC).
-- JSON columns are VARIANT (query them as attributes:dept::VARCHAR). Standard Snowflake tables have
-- no indexes; PRIMARY KEY is recorded but not enforced (the MERGE keeps record_ref unique).
-- _bos_record_hash = sha256 hex of the record's canonical JSON.

CREATE TABLE IF NOT EXISTS bos_records (
    record_ref        VARCHAR(512) NOT NULL,
    display_name      TEXT,
    email             TEXT,
    phone             TEXT,
    lifecycle         VARIANT,
    identity_match    VARIANT,
    attributes        VARIANT NOT NULL,
    sources           VARIANT NOT NULL,
    _bos_observed_at  TIMESTAMP_TZ NOT NULL,
    _bos_synced_at    TIMESTAMP_TZ NOT NULL,
    _bos_run_id       VARCHAR(64) NOT NULL,
    _bos_record_hash  VARCHAR(64) NOT NULL,
    -- sha256 hex of the record's bytes as received: re-runs skip byte-identical records.
    -- Tables made before it: ALTER TABLE bos_records ADD COLUMN _bos_wire_hash VARCHAR(64);
    _bos_wire_hash    VARCHAR(64),
    -- NULL while the row is current; set when a run retired it (a complete full read did not return
    -- it, or it was superseded by the record named in _bos_superseded_by). Tables made before them:
    -- the writer adds both, or run ALTER TABLE bos_records ADD COLUMN _bos_deleted_at TIMESTAMP_TZ;
    -- and ALTER TABLE bos_records ADD COLUMN _bos_superseded_by VARCHAR(512);
    _bos_deleted_at   TIMESTAMP_TZ,
    _bos_superseded_by VARCHAR(512),
    PRIMARY KEY (record_ref)
);

CREATE TABLE IF NOT EXISTS bos_sync_runs (
    run_id               VARCHAR(64) NOT NULL,
    dag_id               VARCHAR(250),
    task_id              VARCHAR(250),
    airflow_run_id       VARCHAR(250),
    conn_id              VARCHAR(250),
    context_handle       VARCHAR(255),
    tool_name            VARCHAR(255),
    arguments_hash       VARCHAR(64),
    started_at           TIMESTAMP_TZ,
    finished_at          TIMESTAMP_TZ NOT NULL,
    status               VARCHAR(16) NOT NULL,   -- complete | partial | failed
    completeness         VARCHAR(32),
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
    -- (superseded BIGINT, scope VARCHAR(64) likewise).
    retired              BIGINT,
    superseded           BIGINT,
    scope                VARCHAR(64),
    -- withheld: records of a partial read under refs a complete read merged away (not revived);
    -- confirmed_at: a complete full read's read time (it confirmed every current row of its scope).
    -- Tables made before them: the writer adds them, or ALTER TABLE bos_sync_runs ADD COLUMN withheld BIGINT;
    -- (confirmed_at TIMESTAMP_TZ likewise).
    withheld             BIGINT,
    confirmed_at         TIMESTAMP_TZ,
    -- coverage: how many of the run's records had a value in each watched column, as JSON
    -- {"records": N, "columns": {"email": n, ...}} (NULL for a failed run; docs/warehouse.md).
    -- Tables made before it: the writer adds it, or ALTER TABLE bos_sync_runs ADD COLUMN coverage VARIANT;
    coverage             VARIANT,
    -- notes: what the run says for information (a re-hash, the policy's report, what a guard held
    -- back); error_message holds only why a run failed or is partial. Tables made before it: the
    -- writer adds it, or ALTER TABLE bos_sync_runs ADD COLUMN notes TEXT;
    notes                TEXT,
    provisional_records  BIGINT,
    provisional_pages    BIGINT,
    source_errors        VARIANT,
    source_summary       VARIANT,
    error_message        TEXT,
    destination_table    VARCHAR(200),
    PRIMARY KEY (run_id)
);

-- Only with invalid_records="quarantine": records bos_records cannot store (one table per records
-- table, named <table>_rejects). record: the record's JSON bytes, at most 64 KiB (truncated: cut).
CREATE TABLE IF NOT EXISTS bos_records_rejects (
    run_id       VARCHAR(64) NOT NULL,
    record_ref   TEXT,
    reason       TEXT NOT NULL,
    record       BINARY NOT NULL,
    truncated    BOOLEAN NOT NULL,
    rejected_at  TIMESTAMP_TZ NOT NULL
);

-- Retirements a complete full read held for a person to decide (on_retire_guard='ask': they
-- passed max_retire_fraction): one row per held record_ref and run; created by the first such run.
CREATE TABLE IF NOT EXISTS bos_records_pending_retirements (
    run_id      VARCHAR(64) NOT NULL,
    record_ref  VARCHAR(512) NOT NULL,
    scope       VARCHAR(64) NOT NULL,
    read_at     TIMESTAMP_TZ NOT NULL,
    held_at     TIMESTAMP_TZ NOT NULL,
    scope_rows  BIGINT,
    PRIMARY KEY (run_id, record_ref)
);

-- Who was merged into whom: one row per (superseded record_ref, successor record_ref) and run
-- (a merge: several rows with one successor_ref; a split: several with one record_ref).
CREATE TABLE IF NOT EXISTS bos_records_lineage (
    run_id         VARCHAR(64) NOT NULL,
    record_ref     VARCHAR(512) NOT NULL,
    successor_ref  VARCHAR(512) NOT NULL,
    recorded_at    TIMESTAMP_TZ NOT NULL
);

-- One row per provenance entry of every row of bos_records (entry_index: its place in the
-- record's sources array). is_current: the record is current (false once retired or superseded).
-- Kept by every run in the run's transaction; built from the sources column by the first run on a
-- table stored before it. "The current record holding this entry" is one look-up of the entry index.
CREATE TABLE IF NOT EXISTS bos_records_sources (
    record_ref      VARCHAR(512) NOT NULL,
    entry_index     BIGINT NOT NULL,
    source_type     VARCHAR(512),
    source_identity VARCHAR(512),
    external_id     VARCHAR(512),
    record_type     VARCHAR(512),
    version         VARCHAR(512),
    capabilities    VARIANT,
    is_current      BOOLEAN NOT NULL,
    PRIMARY KEY (record_ref, entry_index)
);

-- Only with history=True: every version of every record (SCD2); _bos_valid_to NULL = the current one.
CREATE TABLE IF NOT EXISTS bos_records_history (
    record_ref        VARCHAR(512) NOT NULL,
    display_name      TEXT,
    email             TEXT,
    phone             TEXT,
    lifecycle         VARIANT,
    identity_match    VARIANT,
    attributes        VARIANT NOT NULL,
    sources           VARIANT NOT NULL,
    _bos_observed_at  TIMESTAMP_TZ NOT NULL,
    _bos_record_hash  VARCHAR(64) NOT NULL,
    _bos_valid_from   TIMESTAMP_TZ NOT NULL,
    _bos_valid_to     TIMESTAMP_TZ,
    _bos_run_id       VARCHAR(64) NOT NULL,
    PRIMARY KEY (record_ref, _bos_valid_from)
);

-- Only for a table written under a personal-data policy (pii_policy): the policy's fingerprint, one
-- row (the canonical rules, the hash recipe's version and the key's public id; never the key). A run
-- with another policy or key is refused before it reads (see docs/personal-data.md).
CREATE TABLE IF NOT EXISTS bos_records_policy (
    fingerprint  TEXT NOT NULL,
    set_at       TIMESTAMP_TZ NOT NULL,
    run_id       VARCHAR(64)
);

-- Only with attribute_columns (promoted attributes, see docs/warehouse.md): one row per promoted
-- column the records table is filled for (policy: SHA-256 of the personal-data policy fingerprint the
-- stored attributes were under, NULL: none). A configured column without its matching row here (new,
-- re-mapped, configured again after runs without it, or a policy applied since) is filled from the
-- stored attributes by the next run.
CREATE TABLE IF NOT EXISTS bos_records_columns (
    column_name  VARCHAR(250) NOT NULL,
    path         TEXT NOT NULL,
    type         VARCHAR(16) NOT NULL,
    policy       VARCHAR(64),
    filled_at    TIMESTAMP_TZ NOT NULL,
    run_id       VARCHAR(64),
    PRIMARY KEY (column_name)
);

-- The columns themselves: the first run that configures one adds it to bos_records (and
-- bos_records_history, if it exists), nullable, with the type of its kind, as below (one example
-- per type; tests/warehouse/test_promoted_ddl.py checks each against what the writer adds):
-- promoted text: ALTER TABLE bos_records ADD COLUMN department TEXT;
-- promoted text: ALTER TABLE bos_records_history ADD COLUMN department TEXT;
-- promoted integer: ALTER TABLE bos_records ADD COLUMN grade BIGINT;
-- promoted integer: ALTER TABLE bos_records_history ADD COLUMN grade BIGINT;
-- promoted number: ALTER TABLE bos_records ADD COLUMN fte FLOAT;
-- promoted number: ALTER TABLE bos_records_history ADD COLUMN fte FLOAT;
-- promoted boolean: ALTER TABLE bos_records ADD COLUMN is_manager BOOLEAN;
-- promoted boolean: ALTER TABLE bos_records_history ADD COLUMN is_manager BOOLEAN;
-- promoted timestamp: ALTER TABLE bos_records ADD COLUMN hired_at TIMESTAMP_TZ;
-- promoted timestamp: ALTER TABLE bos_records_history ADD COLUMN hired_at TIMESTAMP_TZ;
-- promoted json: ALTER TABLE bos_records ADD COLUMN tags VARIANT;
-- promoted json: ALTER TABLE bos_records_history ADD COLUMN tags VARIANT;
