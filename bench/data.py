"""The benchmark's data: one scenario shape shared by the server and the baselines, and baseline rows.

The server (subprocess) and every baseline build the same :func:`scenario` from the same
:class:`ScenarioParams`, so the baselines load exactly the final records the sync receives.
"""

from __future__ import annotations

import hashlib
import json
import uuid
from collections.abc import Iterator
from dataclasses import asdict, dataclass
from datetime import UTC, datetime
from typing import Any

from airflow_provider_bos.testing.federation import PlannedRead, plan_read
from airflow_provider_bos.testing.scenario import Scenario, large_scenario
from airflow_provider_bos.warehouse.tables.schema import RECORD_COLUMNS, RECORD_JSON_COLUMNS

__all__ = [
    "COLUMNS",
    "JSON_COLUMNS",
    "BaselineRows",
    "ScenarioParams",
    "build_rows",
    "final_record_count",
    "iter_final_records",
    "scenario",
]

# The records table, in insert order (the warehouse's own column list).
COLUMNS = RECORD_COLUMNS
JSON_COLUMNS = RECORD_JSON_COLUMNS
_CONTENT = ("attributes", "display_name", "email", "identity_match", "lifecycle", "phone", "record_ref", "sources")


@dataclass(frozen=True)
class ScenarioParams:
    """What ``large_scenario`` is called with (JSON-able, passed to child processes)."""

    records: int
    sources: int = 4
    shared_people: int = 0
    seed: int = 0
    revision: int = 0
    page_size: int = 100
    #: The day read: 1, or 2 (every source loses 1 % of its people and 1 % change; see ``scenario``).
    day: int = 1
    #: Which read of that day: 0 the first; 1 a later one, every provenance observed_at moved (the
    #: reference server re-stamps each read, as BOS does).
    read: int = 0

    def as_dict(self) -> dict[str, int]:
        return asdict(self)

    @property
    def churn(self) -> int:
        """How many of each source's people day 2 loses, and how many it changes (1 %)."""
        return self.records // max(self.sources, 1) // 100


def scenario(params: ScenarioParams) -> Scenario:
    """The bench scenario; with a day 2 (1 % of each source's people gone, 1 % changed) when it has
    people to spare. Day 1's bytes are the same either way: days only change later days."""
    base = large_scenario(
        params.records,
        sources=params.sources,
        shared_people=params.shared_people,
        seed=params.seed,
        revision=params.revision,
        page_size=params.page_size,
    )
    if not params.churn:
        return base
    each = [{"source": s.source_identity, "count": params.churn} for s in base.sources if s.records]
    return Scenario.model_validate({**base.model_dump(), "days": [{"day": 2, "leave": each, "change": each}]})


def _read(params: ScenarioParams) -> PlannedRead:
    """The bench's federated read of the scenario on ``params.day``, planned as the server plans it."""
    sc = scenario(params)
    return plan_read(sc, request_id="bench", context=sc.resolved_contexts()[0], arguments={}, day=params.day,
                     read_index=params.read)


def iter_final_records(params: ScenarioParams) -> Iterator[dict[str, Any]]:
    """The authoritative final records of the scenario, as the server sends them."""
    return _read(params).iter_final_records()


def _canonical(value: Any) -> str:
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False)


@dataclass
class BaselineRows:
    """Rows pre-built in memory for the baselines (built before the timer starts)."""

    tuples: list[tuple[Any, ...]]  # COLUMNS order; JSON columns as canonical JSON text (None for null)
    payload_bytes: int  # UTF-8 bytes of the text values: the MB/s basis of the baselines


def build_rows(params: ScenarioParams, *, python_json: bool = False) -> BaselineRows:
    """Final records -> row tuples in :data:`COLUMNS` order, each with a SHA-256 content hash.

    ``python_json=True`` keeps the JSON columns as Python objects (the naive SQLAlchemy path
    serialises them itself, as a naive user's code would).
    """
    synced_at = datetime.now(UTC)
    run_id = str(uuid.uuid4())
    out: list[tuple[Any, ...]] = []
    payload = 0
    for record in iter_final_records(params):
        texts = {name: _canonical(record.get(name)) for name in JSON_COLUMNS}
        document = _canonical({name: record.get(name) for name in _CONTENT})
        record_hash = hashlib.sha256(document.encode()).hexdigest()
        observed = max(datetime.fromisoformat(s["observed_at"]) for s in record["sources"]).astimezone(UTC)
        if python_json:
            json_values = [record.get(name) for name in JSON_COLUMNS]
        else:
            json_values = [None if texts[name] == "null" else texts[name] for name in JSON_COLUMNS]
        row = (
            record["record_ref"],
            record.get("display_name"),
            record.get("email"),
            record.get("phone"),
            *json_values,
            observed,
            synced_at,
            run_id,
            record_hash,
        )
        payload += sum(len(t.encode()) for t in texts.values())
        payload += sum(len(v.encode()) for v in row[:4] if v is not None) + len(run_id) + len(record_hash)
        out.append(row)
    return BaselineRows(out, payload)


def final_record_count(params: ScenarioParams) -> int:
    """How many records the final result holds (``records`` unless people are shared)."""
    return _read(params).final_record_count
