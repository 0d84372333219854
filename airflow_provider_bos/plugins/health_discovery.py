"""Where the sync-health page finds the tables BOS syncs write: Airflow's serialized DAGs, and a setting.

**Serialized DAGs** (Airflow's metadata database, the latest version of every DAG that is not
stale): every task of ``BosFederatedReadOperator``. Airflow serializes a task's template fields and
its outlets, not its other arguments, so:

- the destination connection comes from the task's asset alias (``bos:<conn_id>:<schema>:<table>``,
  which the operator sets), or from a mapped task's ``partial`` arguments;
- the table and schema from the template fields ``destination_table`` and ``destination_schema``;
  a templated or mapped table is found in the audit table instead (the tables that DAG's task
  recorded, see :class:`Read`);
- the audit table is not serialized: ``bos_sync_runs`` (the default) unless ``[bos]
  health_destinations`` lists the same connection and table with another audit table.

A sensor task (``BosCompletenessSensor``, or any sensor whose serialized fields carry
``sync_task_id`` and ``min_coverage``) gives its read's coverage thresholds: ``min_coverage`` is
one of ``BosCompletenessSensor``'s template fields, so it is serialized with the DAG.

**The setting** ``[bos] health_destinations``: ``conn_id:table[:audit_table]`` entries (``table``
may be ``schema.table``), separated by commas or whitespace. A listed destination that no DAG
writes is shown only to users who may edit its Connection (see :mod:`.health_access`).

Parsed DAGs are cached per serialized-DAG version (its row id), so a page view parses only DAGs
that changed since the last one.
"""

from __future__ import annotations

import hashlib
import logging
import re
import threading
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from airflow_provider_bos.exceptions import BosError
from airflow_provider_bos.warehouse import validate_identifier

__all__ = [
    "DEFAULT_AUDIT_TABLE",
    "DagInfo",
    "Destination",
    "Read",
    "configured_destinations",
    "destinations_from",
    "load_dags",
    "parse_dag",
    "parse_destinations",
]

log = logging.getLogger(__name__)

DEFAULT_AUDIT_TABLE = "bos_sync_runs"
READ_OPERATOR = "BosFederatedReadOperator"
SENSOR = "BosCompletenessSensor"
_ALIAS_PREFIX = "bos:"
# Airflow's connection ids (letters, digits, _ . - and the / # it also allows).
_CONN_ID = re.compile(r"^[\w.#/-]{1,250}$")
_CACHE_LIMIT = 4096


def _plain(value: Any) -> Any:
    """A serialized value without Airflow's ``{"__type": ..., "__var": ...}`` wrappers."""
    if isinstance(value, Mapping):
        if "__var" in value and "__type" in value:
            return _plain(value["__var"])
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_plain(v) for v in value]
    return value


def _identifier(value: Any, kind: str) -> str | None:
    """``value`` if it is a plain identifier (not a template, not mapped), else None."""
    if not isinstance(value, str) or not value:
        return None
    try:
        return validate_identifier(value, kind=kind)
    except BosError:
        return None


@dataclass(frozen=True)
class Read:
    """One ``BosFederatedReadOperator`` task as serialized: where it writes, as far as the DAG says."""

    dag_id: str
    task_id: str
    conn_id: str
    tables: tuple[str, ...]  # empty: templated or mapped, found in the audit table
    schema: str | None
    audit_table: str = DEFAULT_AUDIT_TABLE
    thresholds: tuple[tuple[str, float], ...] = ()


@dataclass(frozen=True)
class DagInfo:
    """What the page needs of one DAG: its BOS reads, and its schedule (the serialized timetable)."""

    dag_id: str
    reads: tuple[Read, ...] = ()
    timetable: Any = None
    start_date: datetime | None = None
    end_date: datetime | None = None
    is_paused: bool = False
    unlocatable: tuple[str, ...] = ()  # read tasks whose destination connection is not serialized


@dataclass
class Destination:
    """A destination table the page shows: where it is, which DAG tasks write it, what it watches."""

    conn_id: str
    table: str
    schema: str | None = None
    audit_table: str = DEFAULT_AUDIT_TABLE
    writers: list[tuple[str, str]] = field(default_factory=list)  # (dag_id, task_id)
    configured: bool = False
    thresholds: dict[str, float] = field(default_factory=dict)

    @property
    def key(self) -> str:
        """An opaque, stable id for URLs (the page resolves it only among what a user may see)."""
        text = "\x1f".join((self.conn_id, self.schema or "", self.table, self.audit_table))
        return hashlib.sha256(text.encode("utf-8")).hexdigest()[:16]

    @property
    def label(self) -> str:
        return f"{self.schema}.{self.table}" if self.schema else self.table

    @property
    def writer_dags(self) -> list[str]:
        return sorted({dag_id for dag_id, _ in self.writers})


def _timestamp(value: Any) -> datetime | None:
    value = _plain(value)
    if isinstance(value, int | float):
        return datetime.fromtimestamp(float(value), UTC)
    if isinstance(value, str):
        try:
            moment = datetime.fromisoformat(value)
        except ValueError:
            return None
        return moment if moment.tzinfo else moment.replace(tzinfo=UTC)
    return None


def _timetable(dag: Mapping[str, Any], data: Mapping[str, Any]) -> Any:
    """The DAG's timetable, decoded from its serialized form (None when it cannot be)."""
    from airflow_provider_bos.airflow_compat import dag_from_serialized, decode_timetable

    encoded = dag.get("timetable")
    if not isinstance(encoded, Mapping):
        return None
    try:
        return decode_timetable(dict(encoded))
    except Exception:  # a custom timetable this module cannot decode alone: try the whole DAG
        log.debug("BOS sync health: DAG %r: its timetable alone could not be decoded.", dag.get("dag_id"),
                  exc_info=True)
    try:
        return dag_from_serialized(dict(data)).timetable
    except Exception:  # the DAG is shown without a schedule; the log says why
        log.warning("BOS sync health: the schedule of DAG %r could not be read.", dag.get("dag_id"), exc_info=True)
        return None


def _thresholds(value: Any) -> tuple[tuple[str, float], ...]:
    value = _plain(value)
    if not isinstance(value, Mapping):
        return ()
    kept = []
    for column, share in value.items():
        if isinstance(share, int | float) and not isinstance(share, bool) and 0 < float(share) <= 1:
            kept.append((str(column)[:64], float(share)))
    return tuple(sorted(kept))


def _read_of(dag_id: str, task: Mapping[str, Any]) -> Read | None:
    """The :class:`Read` of a serialized ``BosFederatedReadOperator`` task (None: not locatable)."""
    partial = _plain(task.get("partial_kwargs")) or {}
    partial = partial if isinstance(partial, Mapping) else {}
    conn_id, schema, table = None, None, None
    for outlet in _plain(task.get("outlets")) or []:
        name = outlet.get("name") if isinstance(outlet, Mapping) else None
        if isinstance(name, str) and name.startswith(_ALIAS_PREFIX):
            conn_id, _, rest = name[len(_ALIAS_PREFIX):].partition(":")
            schema, _, table = rest.partition(":")
            break
    conn_id = conn_id or partial.get("destination_conn_id")
    if not isinstance(conn_id, str) or not _CONN_ID.match(conn_id):
        return None
    tables: tuple[str, ...] = ()
    named = _identifier(task.get("destination_table", partial.get("destination_table", table)), "table")
    if named is not None and not task.get("_is_mapped"):
        tables = (named,)
    elif task.get("_is_mapped"):
        expand = _plain(task.get("expand_input")) or {}
        values = expand.get("value") if isinstance(expand, Mapping) else None
        listed = values.get("destination_table") if isinstance(values, Mapping) else None
        if isinstance(listed, list):
            tables = tuple(t for t in (_identifier(v, "table") for v in listed) if t)
        elif named is not None and "destination_table" not in (values or {}):
            tables = (named,)
    schema_value = task.get("destination_schema", partial.get("destination_schema", schema))
    schema_name = _identifier(schema_value, "schema") if schema_value else None
    if schema_value and schema_name is None:
        tables = ()  # a templated schema: the audit rows say where
    audit = _identifier(task.get("audit_table", partial.get("audit_table")), "audit table") or DEFAULT_AUDIT_TABLE
    return Read(dag_id, str(task.get("task_id")), conn_id, tables, schema_name or None, audit)


def parse_dag(data: Mapping[str, Any], *, is_paused: bool = False) -> DagInfo:
    """The :class:`DagInfo` of one serialized DAG (``SerializedDagModel.data``)."""
    inner = data.get("dag")
    dag: Mapping[str, Any] = inner if isinstance(inner, Mapping) else data
    dag_id = str(dag.get("dag_id"))
    tasks = [t.get("__var", t) for t in dag.get("tasks") or [] if isinstance(t, Mapping)]
    reads: dict[str, Read] = {}
    unlocatable: list[str] = []
    thresholds: dict[str, tuple[tuple[str, float], ...]] = {}
    for task in tasks:
        if not isinstance(task, Mapping):
            continue
        task_type = task.get("task_type") or task.get("_task_type")
        if task_type == READ_OPERATOR:
            read = _read_of(dag_id, task)
            if read is None:
                unlocatable.append(str(task.get("task_id")))
            else:
                reads[read.task_id] = read
        elif (task_type == SENSOR or task.get("_is_sensor")) and "min_coverage" in task:
            sync = _plain(task.get("sync_task_id"))
            if isinstance(sync, str) and sync:
                thresholds[sync] = _thresholds(task.get("min_coverage"))
    for task_id, found in thresholds.items():
        if task_id in reads and found:
            read = reads[task_id]
            reads[task_id] = Read(read.dag_id, read.task_id, read.conn_id, read.tables, read.schema,
                                  read.audit_table, found)
    return DagInfo(
        dag_id=dag_id,
        reads=tuple(reads.values()),
        timetable=_timetable(dag, data) if reads else None,
        start_date=_timestamp(dag.get("start_date")),
        end_date=_timestamp(dag.get("end_date")),
        is_paused=is_paused,
        unlocatable=tuple(unlocatable),
    )


def parse_destinations(value: str) -> list[tuple[str, str | None, str, str]]:
    """``[bos] health_destinations`` as ``(conn_id, schema, table, audit_table)``; a malformed entry
    is logged and skipped."""
    found = []
    for entry in (item for item in re.split(r"[,\s]+", value or "") if item):
        parts = entry.split(":")
        try:
            if len(parts) not in (2, 3) or not _CONN_ID.match(parts[0]):
                raise ValueError("expected conn_id:table[:audit_table]")
            schema, _, table = parts[1].rpartition(".")
            audit = parts[2] if len(parts) == 3 else DEFAULT_AUDIT_TABLE
            found.append((parts[0], validate_identifier(schema, kind="schema") if schema else None,
                          validate_identifier(table, kind="table"), validate_identifier(audit, kind="audit table")))
        except (ValueError, BosError) as exc:
            log.warning("BOS sync health: [bos] health_destinations entry %r is ignored: %s", entry[:200], exc)
    return found


def configured_destinations() -> list[tuple[str, str | None, str, str]]:
    from airflow.configuration import conf

    return parse_destinations(conf.get("bos", "health_destinations", fallback="") or "")


def destinations_from(
    dags: Iterable[DagInfo],
    configured: Iterable[tuple[str, str | None, str, str]],
    resolved: Mapping[tuple[str, str], Iterable[tuple[str | None, str]]] | None = None,
) -> list[Destination]:
    """Every destination: the DAGs' reads (``resolved`` gives the tables a templated or mapped read
    recorded, per ``(dag_id, task_id)``, as ``(schema, table)``), then the configured ones."""
    configured = list(configured)
    audit_of = {(conn, schema, table): audit for conn, schema, table, audit in configured}
    found: dict[tuple[str, str | None, str, str], Destination] = {}
    for dag in dags:
        for read in dag.reads:
            tables = [(read.schema, t) for t in read.tables]
            if not tables and resolved is not None:
                tables = list(resolved.get((read.dag_id, read.task_id), ()))
            for schema, table in tables:
                audit = read.audit_table
                if audit == DEFAULT_AUDIT_TABLE:
                    audit = audit_of.get((read.conn_id, schema, table), audit)
                key = (read.conn_id, schema, table, audit)
                destination = found.setdefault(key, Destination(read.conn_id, table, schema, audit))
                if (read.dag_id, read.task_id) not in destination.writers:
                    destination.writers.append((read.dag_id, read.task_id))
                destination.thresholds.update(dict(read.thresholds))
    for conn, schema, table, audit in configured:
        destination = found.setdefault((conn, schema, table, audit), Destination(conn, table, schema, audit))
        destination.configured = True
    return sorted(found.values(), key=lambda d: (d.label, d.conn_id, d.audit_table))


# --- Airflow's metadata database ------------------------------------------------------------------

_parsed: dict[str, DagInfo] = {}
_lock = threading.Lock()


def load_dags() -> list[DagInfo]:
    """Every active DAG with a BOS read, from the latest serialized version of each (cached per version)."""
    import sqlalchemy as sa
    from airflow.models.dag import DagModel
    from airflow.models.dag_version import DagVersion
    from airflow.models.serialized_dag import SerializedDagModel
    from airflow.utils.session import create_session

    with create_session() as session:
        paused = dict(session.execute(
            sa.select(DagModel.dag_id, DagModel.is_paused).where(DagModel.is_stale.is_(False))).all())
        latest: dict[str, tuple[int, str]] = {}
        row_id: Any
        for row_id, dag_id, version in session.execute(
            sa.select(SerializedDagModel.id, SerializedDagModel.dag_id, DagVersion.version_number)
            .join(DagVersion, SerializedDagModel.dag_version_id == DagVersion.id)
        ):
            if dag_id in paused and (dag_id not in latest or version > latest[dag_id][0]):
                latest[dag_id] = (int(version), str(row_id))
        wanted = {row_id for _version, row_id in latest.values()}
        with _lock:
            missing = wanted - set(_parsed)
        if missing:
            import uuid

            for serialized in session.scalars(
                sa.select(SerializedDagModel).where(SerializedDagModel.id.in_([uuid.UUID(m) for m in missing]))
            ):
                try:
                    info = parse_dag(serialized.data or {})
                except Exception:  # one unreadable DAG does not hide the others; the log says why
                    log.warning("BOS sync health: DAG %r could not be read.", serialized.dag_id, exc_info=True)
                    info = DagInfo(dag_id=serialized.dag_id)
                with _lock:
                    if len(_parsed) >= _CACHE_LIMIT:
                        _parsed.clear()
                    _parsed[str(serialized.id)] = info
    dags = []
    with _lock:
        for dag_id, (_version, row_id) in sorted(latest.items()):
            cached = _parsed.get(row_id)
            if cached is not None and (cached.reads or cached.unlocatable):
                dags.append(DagInfo(cached.dag_id, cached.reads, cached.timetable, cached.start_date,
                                    cached.end_date, bool(paused.get(dag_id)), cached.unlocatable))
    return dags
