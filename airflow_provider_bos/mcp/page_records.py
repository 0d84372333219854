"""Source-result pages decoded fast: a page's records are shape-checked and counted, not built.

A page's records are provisional (progress, never data): the tracker needs how many there are
and that each has the contract's record shape, not Python objects for every field. msgspec checks
that shape in C (``record_ref`` a non-empty string, ``sources`` a non-empty list of objects whose
``observed_at`` is a string: the tracker's page-record rules) while skipping
the rest of each record; the records are decoded only if someone reads them
(``SourceProgress.notification.records``). Measured on 2,000 pages of 100 records (140 MB):
orjson decoding every record 0.93 s, this 0.22 s.

The page's own fields (``requestId``, ``sequence``, ``source``, ...) and, when read, its
records are decoded by orjson, exactly as the general path decodes them. msgspec checks the UTF-8
of the strings it reads, not of the fields it skips: a record holding bytes that are not UTF-8 is
decoded, when read, with replacement characters, as the general path's SSE decoding would have
done. One difference remains, on purpose:
a record's other fields are checked for JSON syntax only, so a number out of float range
(``1e400``) deep in a provisional record is not decoded at all (the general path decodes it as a
:class:`~airflow_provider_bos.json_numbers.NumberBeyondDouble`); reading those records raises
:class:`~airflow_provider_bos.exceptions.BosProtocolError`.

Whatever this path does not accept (another envelope shape, a server-to-client request, a record
failing the check, bytes that are not JSON) makes :func:`decode_source_result` return ``None``:
the message then takes the general path, which decodes it fully and names the violation.
"""

from __future__ import annotations

from typing import Annotated, Any

import msgspec
from orjson import loads

from airflow_provider_bos.exceptions import BosProtocolError

__all__ = ["PageRecords", "decode_source_result"]


class _Provenance(msgspec.Struct):
    observed_at: str


class _PageRecord(msgspec.Struct):
    record_ref: Annotated[str, msgspec.Meta(min_length=1)]
    sources: Annotated[list[_Provenance], msgspec.Meta(min_length=1)]


class _Notification(msgspec.Struct):
    method: str
    params: dict[str, msgspec.Raw]
    # Present only on a server-to-client request, which the general path ignores.
    id: msgspec.Raw | msgspec.UnsetType = msgspec.UNSET


_ENVELOPE = msgspec.json.Decoder(_Notification)
_RECORDS = msgspec.json.Decoder(list[_PageRecord])


class PageRecords:
    """A page's records: checked and counted; :meth:`decode` builds them (plain dicts) on demand."""

    __slots__ = ("count", "_raw")

    def __init__(self, raw: msgspec.Raw, count: int) -> None:
        self._raw = raw
        self.count = count

    def decode(self) -> list[dict[str, Any]]:
        try:
            return loads(memoryview(self._raw))  # type: ignore[no-any-return]
        except ValueError:
            pass
        try:  # bytes that are not UTF-8 inside a field: replaced, as the general path's SSE decoding does
            return loads(bytes(self._raw).decode("utf-8", "replace"))  # type: ignore[no-any-return]
        except ValueError:
            raise BosProtocolError(
                f"A page's {self.count} provisional records do not decode (a number out of range?)."
            ) from None

    def __len__(self) -> int:
        return self.count

    def __repr__(self) -> str:
        return f"PageRecords(count={self.count})"


def decode_source_result(data: str | bytes, method: str) -> dict[str, Any] | None:
    """The ``params`` of a ``method`` notification with ``records`` as :class:`PageRecords`.

    ``None``: not such a notification, or not one this path takes; decode ``data`` the general way.
    """
    try:
        message = _ENVELOPE.decode(data)
    except (msgspec.DecodeError, RecursionError):  # DecodeError: also msgspec.ValidationError
        return None
    if message.method != method or message.id is not msgspec.UNSET:
        return None
    fields = message.params
    raw = fields.get("records")
    if raw is None:
        return None
    try:
        count = len(_RECORDS.decode(raw))
        # The envelope's own values as the general path decodes them (orjson: same numbers).
        params = {name: loads(memoryview(value)) for name, value in fields.items() if name != "records"}
    except (msgspec.DecodeError, RecursionError, ValueError):
        return None
    params["records"] = PageRecords(raw, count)
    return params
