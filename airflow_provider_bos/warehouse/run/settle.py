"""What a load left (one of three typed outcomes, each carrying what settling it needs and its
counts), and :func:`settle`, the ONE function that classifies and merges it."""

from __future__ import annotations

from dataclasses import dataclass, replace
from datetime import datetime

from airflow_provider_bos.warehouse.run.claims import KeptClaims, WireHashSet, stage_kept_claims
from airflow_provider_bos.warehouse.run.loads import SeenKeys, keys_distinct
from airflow_provider_bos.warehouse.run.transaction import RunTransaction, UpsertCounts

__all__ = ["DirectLoad", "LoadOutcome", "StagedLoad", "StagedWithKeptClaims", "settle"]


@dataclass(frozen=True, slots=True)
class DirectLoad:
    """An empty (locked) table loaded directly: ``loaded`` rows in it, ``staged`` later copies in staging."""

    loaded: int
    staged: int
    synced_at: datetime  # the loaded rows' stamp, which the merge of the later copies gives too


@dataclass(frozen=True, slots=True)
class StagedLoad:
    """Every record staged (claims as known rows), its key watched by ``seen``; ``parse_json``: JSONB staging."""

    staged: int
    seen: SeenKeys
    parse_json: bool


@dataclass(frozen=True, slots=True)
class StagedWithKeptClaims:
    """As :class:`StagedLoad`, with ``kept.count`` claims kept out of staging (confirmed by the state token)."""

    staged: int
    seen: SeenKeys
    parse_json: bool
    kept: KeptClaims


LoadOutcome = DirectLoad | StagedLoad | StagedWithKeptClaims


def settle(tx: RunTransaction, outcome: LoadOutcome) -> UpsertCounts:
    """Classify and merge what the load left, under the writers' lock; the run's counts."""
    match outcome:
        case DirectLoad(loaded=loaded, staged=staged, synced_at=synced_at):
            return _merge_later_copies(tx, loaded, staged, synced_at)
        case StagedLoad(staged=staged, seen=seen, parse_json=parse_json):
            return tx.classify_and_merge(staged, parse_json=parse_json, maybe_duplicates=not keys_distinct(tx, seen))
        case StagedWithKeptClaims(staged=staged, seen=seen, parse_json=parse_json, kept=kept):
            return _confirm_kept_claims(tx, staged, seen, kept, parse_json=parse_json)


def _merge_later_copies(tx: RunTransaction, loaded: int, staged: int, synced_at: datetime) -> UpsertCounts:
    """Counts of a direct load; merges what it staged (later copies of record_refs).

    The table was empty under the lock, so every row in it is this run's: a staged record_ref
    found there is a duplicate. The merge's guard (stored observed_at not newer, content
    differs) lets the staged copy replace the loaded one exactly when dedupe would have picked
    it: it is later in the result, so it wins ties.
    """
    if staged == 0:
        return UpsertCounts(inserted=loaded)
    source, _ = tx.dedupe(staged, parse_json=False)
    new, updated, _, _ = tx.classify(source)
    inserted = loaded + new
    tx.merge(source, synced_at=synced_at, new_only=False, inserted=new, updated=updated)
    if tx.dialect.wire_hash_column:
        tx.exec(tx.dialect.adopt_later_copies(source, tx.table, tx.schema))
    return UpsertCounts(inserted=inserted, duplicates=loaded + staged - inserted)


def _confirm_kept_claims(
    tx: RunTransaction, staged: int, seen: SeenKeys, kept: KeptClaims, *, parse_json: bool,
) -> UpsertCounts:
    """Classify and merge a run whose claims were kept out of staging.

    Usually (an unchanged re-run) no key is shared between claims and staged records and no row
    with a wire hash changed since the read matched the claims (the table's state token, taken
    again under the lock, is the one read with the hashes): the claimed rows are unchanged
    without a join. Otherwise the claims are staged from the very rows they matched, under the
    lock, and everything goes the general way (a matched row gone or changed fails the run).
    """
    apart = _claims_apart(tx, staged, seen, kept)
    tx.lock()
    if apart and _state_unchanged(tx, kept.known):
        kept.state_unchanged = True
        if staged:
            counts = tx.classify_and_merge(staged, parse_json=parse_json, maybe_duplicates=False)
        else:
            counts = UpsertCounts()
        # The same bytes claimed twice are duplicates of one stored row (identical content).
        return replace(counts, unchanged=counts.unchanged + kept.rows, duplicates=counts.duplicates + kept.repeats)
    stage_kept_claims(tx, kept)
    counts = tx.classify_and_merge(staged + kept.rows, parse_json=parse_json, maybe_duplicates=not apart)
    return replace(counts, duplicates=counts.duplicates + kept.repeats)


def _claims_apart(tx: RunTransaction, staged: int, seen: SeenKeys, kept: KeptClaims) -> bool:
    """True if no record_ref was staged twice, nor both staged and claimed."""
    if not keys_distinct(tx, seen):
        return False
    if not staged:  # an unchanged re-run: nothing to look up
        return True
    # A claim's key is its stored row's: a staged key whose stored row's hash was claimed is both.
    statement = tx.dialect.staged_stored_prefixes(tx.stage, tx.table, tx.schema)
    return not any(kept.claimed_prefix(prefix) for prefix in tx.exec(statement).scalars())


def _state_unchanged(tx: RunTransaction, known: WireHashSet) -> bool:
    """The table's state token now (under the lock) is the one read with ``known``."""
    statement = tx.dialect.stored_wire_state(tx.table, tx.schema)
    assert statement is not None
    return tuple(int(v) for v in tx.exec(statement).one()) == known.state
