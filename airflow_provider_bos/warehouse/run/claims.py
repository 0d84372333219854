"""Known records: the stored wire hashes a read matches against, and the claims it hands back.

The warehouse's side of :mod:`airflow_provider_bos.wire`'s seam. :class:`WireHashSet` is its
:class:`~airflow_provider_bos.wire.KnownWireHashes` (loaded by :func:`load_known_wire_hashes`,
with the table's *state token*); a :class:`~airflow_provider_bos.wire.KnownRecord` it matched
carries a position in it as its handle. Every claim is confirmed before the run commits:

- staged as a known row and verified by the classification's join (any dialect), or
- with a loader that keeps claims and a state token, kept out of staging (:class:`KeptClaims`)
  and confirmed all at once when the run is settled (:mod:`.settle`): the token taken again under
  the lock equals the one read with the hashes, so no stored wire hash changed since.
"""

from __future__ import annotations

import operator
import sys
from array import array
from bisect import bisect_left
from collections import Counter
from collections.abc import Iterable
from datetime import datetime
from itertools import accumulate, islice
from typing import cast

import sqlalchemy as sa

from airflow_provider_bos.warehouse.dialects import WarehouseDialect
from airflow_provider_bos.warehouse.run.transaction import RunTransaction, execute
from airflow_provider_bos.wire import KnownRecord

__all__ = [
    "KeptClaims", "WireHashSet", "kept_claims", "load_known_wire_hashes", "stage_kept_claims",
]


def _prefix(wire_hash: str) -> int:
    return int(wire_hash[:16], 16)


class WireHashSet:
    """The stored wire hashes, as a sorted array of their first 8 bytes (8 MB per million rows).

    The warehouse's :class:`~airflow_provider_bos.wire.KnownWireHashes`: :meth:`match` gives the
    position of a hash's prefix, the handle a :class:`KeptClaims` marks.

    Membership is by prefix (64 bits): the warehouse still confirms each hit against the table
    (see :class:`KnownRecord`). Built from hex digests in any order.
    """

    __slots__ = ("prefixes", "buckets", "state", "_unique")

    def __init__(self, wire_hashes: Iterable[str] = ()) -> None:
        prefixes = array("Q")
        for wire_hash in wire_hashes:
            try:
                prefixes.append(_prefix(wire_hash))
            except (TypeError, ValueError):  # a value we did not write: it can only miss
                continue
        self._index(array("Q", sorted(prefixes)))

    @classmethod
    def from_sorted_prefix_text(cls, text: str | None) -> WireHashSet:
        """From the 16-hex-digit prefixes concatenated in ascending order (one value from SQL)."""
        prefixes = array("Q")
        if text:
            prefixes.frombytes(bytes.fromhex(text))
            if sys.byteorder == "little":  # the hex is big-endian
                prefixes.byteswap()
        known = cls.__new__(cls)  # already sorted: index it once, not after an empty __init__
        known._index(prefixes)
        return known

    def _index(self, prefixes: array) -> None:  # type: ignore[type-arg]
        #: The warehouse's token of the table these hashes were read from (compared again under its
        #: lock: equal means no stored hash changed since); None: none was taken.
        self.state: object = None
        self._unique: bool | None = None
        #: The sorted prefixes, as unsigned 64-bit integers (a claim's handle is a position here).
        self.prefixes = prefixes
        #: ``prefixes[buckets[k]:buckets[k + 1]]`` are those whose top 16 bits are ``k``: a search
        #: looks at a handful of entries instead of log2(n) (a bisect over the whole array costs
        #: a microsecond per record).
        # Counted in C (the prefixes' top 16 bits as an array of its own, then a Counter): the
        # load runs on a thread beside the read, where a Python loop per row held the GIL.
        raw = prefixes.tobytes()
        # Each item's top 16 bits as a native uint16: its two most significant bytes, in order.
        if sys.byteorder == "little":
            first, second = raw[6::8], raw[7::8]
        else:
            first, second = raw[0::8], raw[1::8]
        tops = bytearray(2 * len(prefixes))
        tops[0::2], tops[1::2] = first, second
        sizes = [0] * 65537
        for top, size in Counter(array("H", bytes(tops))).items():
            sizes[top + 1] = size
        self.buckets = array("L", accumulate(sizes))

    def __len__(self) -> int:
        return len(self.prefixes)

    def __contains__(self, wire_hash: object) -> bool:
        return self.position(wire_hash) >= 0

    def match(self, wire_hash: str) -> int | None:
        """:class:`KnownWireHashes` handle: the position of ``wire_hash``'s prefix, or None."""
        position = self.position(wire_hash)
        return position if position >= 0 else None

    def position(self, wire_hash: object) -> int:
        """Index of ``wire_hash``'s prefix in :attr:`prefixes`, or -1 if it is not there."""
        if not isinstance(wire_hash, str):
            return -1
        try:
            key = _prefix(wire_hash)
        except ValueError:
            return -1
        return self.prefix_position(key)

    def prefix_position(self, key: int) -> int:
        """Index of the 64-bit prefix ``key`` in :attr:`prefixes`, or -1."""
        prefixes, buckets = self.prefixes, self.buckets
        hi = buckets[(key >> 48) + 1]
        i = bisect_left(prefixes, key, buckets[key >> 48], hi)
        return i if i < hi and prefixes[i] == key else -1

    @property
    def unique(self) -> bool:
        """No two stored hashes share a prefix (so a position names exactly one stored row)."""
        if self._unique is None:
            prefixes = self.prefixes  # sorted: a repeat is next to its twin (compared in C, no set)
            self._unique = not any(map(operator.eq, prefixes, islice(prefixes, 1, None)))
        return self._unique


def load_known_wire_hashes(
    conn: sa.Connection, dialect: WarehouseDialect, table: str, schema: str | None
) -> WireHashSet:
    """The wire hashes stored in ``table`` (the dialect must know it has the column)."""
    statement = dialect.wire_hash_prefixes(table, schema)
    if dialect.capabilities.wire_hash_prefixes_aggregated:
        # The prefixes, then the table's state token from the same scan (see settle._confirm_kept_claims).
        text, *state = execute(conn, statement).one()
        known = WireHashSet.from_sorted_prefix_text(text)
        known.state = tuple(int(v) for v in state) if state else None
        return known
    # Streamed (a server-side cursor where the driver has one): only the 8-byte prefixes are kept,
    # not a string per stored row.
    streamed = conn.execution_options(stream_results=True, yield_per=10_000)
    return WireHashSet(execute(streamed, statement).scalars())


class KeptClaims:
    """A run's KnownRecord claims kept out of staging: which stored rows were claimed, and when.

    A claim names a stored row by the position of its wire-hash prefix in the :class:`WireHashSet`
    the read matched it in (``hits``: 1 byte per stored row). If it must be staged after all, the
    dedupe takes the claim of that row it would pick among its copies: the latest ``observed_at``,
    then the last in the read (``observed``, ``last_seq``). A key also staged in the same run is
    found in SQL (see :func:`_claims_apart`).
    """

    def __init__(self, known: WireHashSet) -> None:
        self.known = known
        self.hits = bytearray(len(known))
        self.last_seq = array("q", bytes(8 * len(known)))
        self.observed: list[datetime | None] = [None] * len(known)
        #: Claims kept, and how many of them repeated an earlier one (the same bytes again).
        self.count = self.repeats = 0
        #: The claims were staged as known rows after all (:func:`stage_kept_claims`).
        self.staged = False
        #: The settle proved them unchanged by the table's state token (nothing changed since the read).
        self.state_unchanged = False

    def keep(self, claim: KnownRecord, seq: int) -> bool:
        """Keep ``claim`` out of staging; False for one matched elsewhere (it is staged as before)."""
        if claim.matched is not self.known:
            return False
        position = cast(int, claim.handle)  # matched by this set: its own row position
        observed, earlier = claim.observed_at, self.observed[position]
        if self.hits[position]:
            self.repeats += 1
        else:
            self.hits[position] = 1
        # An earlier observation of the same bytes than one already kept: the dedupe keeps the other.
        if observed is None or earlier is None or observed >= earlier:
            self.last_seq[position] = seq
            self.observed[position] = observed
        self.count += 1
        return True

    @property
    def rows(self) -> int:
        """How many distinct stored rows were claimed."""
        return self.count - self.repeats

    def unclaimed_prefixes(self) -> list[str]:
        """The stored wire-hash prefixes (16 hex digits) no kept claim matched."""
        prefixes = self.known.prefixes
        return [f"{prefixes[i]:016x}" for i, hit in enumerate(self.hits) if not hit]

    def claimed_prefix(self, prefix: str) -> bool:
        """True if a kept claim matched the stored wire hash that starts with ``prefix``."""
        try:
            position = self.known.prefix_position(int(prefix, 16)) if len(prefix) == 16 else -1
        except ValueError:  # not hex: no claim can have matched it
            return False
        return position >= 0 and self.hits[position] == 1


def kept_claims(tx: RunTransaction, known: object, *, keeps_claims: bool) -> KeptClaims | None:
    """Where the run's claims go: kept out of staging (COPY with a table state token), or staged (None)."""
    if (
        not isinstance(known, WireHashSet) or known.state is None or not len(known) or not keeps_claims
        or tx.dialect.stored_wire_state(tx.table, tx.schema) is None or not known.unique
    ):
        return None
    return KeptClaims(known)


def stage_kept_claims(tx: RunTransaction, kept: KeptClaims) -> None:
    """Stage every kept claim as a known row, from the stored row it matched (under the lock); also
    after the merge, when a lifecycle step needs every record_ref of the run in staging."""
    if kept.staged:
        return
    kept.staged = True
    prefixes, seqs, observed = kept.known.prefixes, kept.last_seq, kept.observed
    positions = [i for i, hit in enumerate(kept.hits) if hit]
    statement = tx.dialect.stage_claims(
        tx.stage, tx.table, tx.schema, [f"{prefixes[i]:016x}" for i in positions], [seqs[i] for i in positions],
        [observed[i] for i in positions],
    )
    assert statement is not None  # kept only where the dialect has a state token (kept_claims)
    found = tx.exec(statement).rowcount
    if found != len(positions):
        raise tx.unverified(abs(len(positions) - found))
