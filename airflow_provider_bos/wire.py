"""Records as they came over the wire, and the wire hashes that let a re-run skip unchanged ones.

Shared by the protocol core (the final-frame scanner makes these objects) and the warehouse
(which stores each record's wire hash and, on the next run, says which hashes it already has).

The *wire hash* of a record is the SHA-256 (hex) of the exact bytes of its JSON element in the
final frame's records array. Identical bytes mean identical content, so a record whose wire hash
equals the one stored with its ``record_ref`` is unchanged without decoding it. The converse does
not hold (a server may re-order keys), so the canonical ``_bos_record_hash`` stays the authority:
a wire-hash miss only means "take the normal path".
"""

from __future__ import annotations

import operator
import sys
from array import array
from bisect import bisect_left
from collections import Counter
from itertools import accumulate, islice
from collections.abc import Iterable
from typing import Protocol

__all__ = ["KnownRecord", "KnownWireHashes", "WireHashSet", "WireRecord"]


class WireRecord(dict):  # type: ignore[type-arg]
    """A record decoded from the wire's JSON text (a plain dict otherwise).

    ``from_json = True`` tells the warehouse it holds no NaN/Infinity and only string keys, so it
    may take its orjson fast path. ``wire_hash``: the record's wire hash, when the scanner cut its
    exact bytes (unset for records built any other way: read it with ``getattr(r, "wire_hash", None)``).
    """

    __slots__ = ("wire_hash",)
    from_json = True


class KnownWireHashes(Protocol):
    """The wire hashes a record sink already stores, as a read may match records against them.

    The sink implements it; the read only asks :meth:`match` and hands the answer back inside a
    :class:`KnownRecord`, never looking into it.
    """

    def match(self, wire_hash: str) -> object | None:
        """An opaque handle of the stored row(s) with this wire hash, or None if there is none."""
        ...


class KnownRecord:
    """A record NOT decoded because its wire hash is one the warehouse already stores.

    Only a claim: the warehouse must confirm that the stored row it matched still holds these bytes
    before counting it unchanged (a join on ``record_ref`` and ``wire_hash``, or a table state
    unchanged since ``matched`` was read), and fail the run otherwise (the record's content is not
    here to write).
    """

    __slots__ = ("record_ref", "wire_hash", "matched", "handle")

    def __init__(
        self, record_ref: str, wire_hash: str, matched: KnownWireHashes | None = None, handle: object = None,
    ) -> None:
        self.record_ref = record_ref
        self.wire_hash = wire_hash
        #: The :class:`KnownWireHashes` it was matched in, and the opaque handle its ``match`` gave.
        self.matched = matched
        self.handle = handle

    def __repr__(self) -> str:
        return f"KnownRecord({self.record_ref!r}, {self.wire_hash[:12]}...)"


def _prefix(wire_hash: str) -> int:
    return int(wire_hash[:16], 16)


class WireHashSet:
    """The stored wire hashes, as a sorted array of their first 8 bytes (8 MB per million rows).

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
        #: The sorted prefixes, as unsigned 64-bit integers (the scanner searches them inline).
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
