"""The sync-health page's model: which destinations a user sees, and what each one's runs say.

Joins :mod:`.health_discovery` (where the tables are), :mod:`.health_access` (who sees which),
:mod:`.health_queries` (what the audit table says, in SQL) and :mod:`.health_schedule` (on time or
not). A destination that cannot be read is reported as such; it never fails the page.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Iterable
from concurrent.futures import ThreadPoolExecutor, wait
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

import sqlalchemy as sa

from airflow_provider_bos.exceptions import BosError
from airflow_provider_bos.plugins.health_access import Viewer
from airflow_provider_bos.plugins.health_discovery import DagInfo, Destination, destinations_from
from airflow_provider_bos.plugins.health_engines import (
    CONNECT_TIMEOUT_S,
    STATEMENT_TIMEOUT_S,
    destination_engine,
)
from airflow_provider_bos.plugins.health_queries import (
    AuditMissing,
    AuditTarget,
    HealthReader,
    RunFilter,
    TableHealth,
    Window,
)
from airflow_provider_bos.plugins.health_schedule import Punctuality, punctuality, worst
from airflow_provider_bos.warehouse import audit_table, dialect_for, validate_identifier, validate_schema

__all__ = ["HealthService", "TableView", "recorded_tables"]

log = logging.getLogger(__name__)
#: The longest the overview waits for all its destinations together.
OVERVIEW_DEADLINE_S = CONNECT_TIMEOUT_S + 2 * STATEMENT_TIMEOUT_S


@dataclass
class TableView:
    """One destination as a user sees it: its health, or why it could not be read."""

    destination: Destination
    health: TableHealth | None = None
    error: str | None = None
    no_audit_table: bool = False  # the error is only that no run was recorded yet
    state: Punctuality | None = None
    per_dag: dict[str, Punctuality] = field(default_factory=dict)
    writers: list[tuple[str, str]] = field(default_factory=list)  # the (dag, task) pairs the user may see

    def as_json(self) -> dict[str, Any]:
        d = self.destination
        return {
            "key": d.key, "conn_id": d.conn_id, "schema": d.schema, "table": d.table, "audit_table": d.audit_table,
            "configured": d.configured, "writers": [{"dag_id": a, "task_id": b} for a, b in self.writers],
            "thresholds": d.thresholds, "error": self.error, "no_audit_table": self.no_audit_table,
            "state": self.state.as_json() if self.state else None,
            "per_dag": {dag: p.as_json() for dag, p in self.per_dag.items()},
            "health": self.health.as_json() if self.health else None,
        }


def recorded_tables(engine: sa.Engine, audit: str, schema: str | None, dag_id: str, task_id: str,
                    ) -> list[tuple[str | None, str]]:
    """The tables a DAG's task recorded in ``audit`` (``schema.table`` split), for a templated or
    mapped read whose table the serialized DAG does not say."""
    dialect = dialect_for(engine)
    t = audit_table(sa.MetaData(), dialect.name, validate_identifier(audit, kind="audit table"),
                    validate_schema(schema, dialect.name))
    with engine.connect() as conn:
        rows = conn.execute(sa.select(t.c.destination_table).where(t.c.dag_id == dag_id, t.c.task_id == task_id)
                            .distinct().limit(200)).scalars().all()
    found = []
    for recorded in rows:
        if not isinstance(recorded, str):
            continue
        owner, _, name = recorded.rpartition(".")
        try:
            found.append((validate_identifier(owner, kind="schema") if owner else None,
                          validate_identifier(name, kind="table")))
        except BosError:
            continue
    return found


class HealthService:
    """One page view's work: open each destination once, read what the user may see, close."""

    def __init__(
        self,
        dags: Iterable[DagInfo],
        configured: Iterable[tuple[str, str | None, str, str]],
        *,
        viewer: Viewer | None,
        now: datetime | None = None,
        engine_for: Callable[[str], sa.Engine] = destination_engine,
        max_grace: timedelta = timedelta(minutes=60),
    ) -> None:
        self.dags = {dag.dag_id: dag for dag in dags}
        self.configured = list(configured)
        self.viewer = viewer
        self.now = now or datetime.now(UTC)
        self.engine_for = engine_for
        self.max_grace = max_grace
        self._engines: dict[str, sa.Engine] = {}
        self._lock = threading.Lock()
        self._destinations: list[Destination] | None = None

    # --- engines ----------------------------------------------------------------------------------

    def engine(self, conn_id: str) -> sa.Engine:
        with self._lock:
            if conn_id not in self._engines:
                self._engines[conn_id] = self.engine_for(conn_id)
            return self._engines[conn_id]

    def close(self) -> None:
        with self._lock:
            engines, self._engines = list(self._engines.values()), {}
        for engine in engines:
            engine.dispose()

    def __enter__(self) -> HealthService:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # --- what the user sees -----------------------------------------------------------------------

    def _dag_visible(self, dag_id: str) -> bool:
        return self.viewer is None or dag_id in self.viewer.readable

    def destinations(self) -> list[Destination]:
        """Every destination the user may see (templated and mapped reads resolved from their audit rows)."""
        if self._destinations is not None:
            return self._destinations
        visible_dags = [dag for dag in self.dags.values() if self._dag_visible(dag.dag_id)]
        resolved: dict[tuple[str, str], list[tuple[str | None, str]]] = {}
        for dag in visible_dags:
            for read in dag.reads:
                if read.tables:
                    continue
                try:
                    resolved[(read.dag_id, read.task_id)] = recorded_tables(
                        self.engine(read.conn_id), read.audit_table, read.schema, read.dag_id, read.task_id)
                except (sa.exc.SQLAlchemyError, BosError, OSError) as exc:
                    log.info("BOS sync health: the tables of %s.%s could not be looked up: %s",
                             read.dag_id, read.task_id, type(exc).__name__)
        every = destinations_from(visible_dags, self.configured, resolved)
        self._destinations = [d for d in every if self.viewer is None or self.viewer.sees(d)]
        return self._destinations

    def find(self, key: str) -> Destination | None:
        return next((d for d in self.destinations() if d.key == key), None)

    def unlocatable(self) -> list[tuple[str, str]]:
        """Read tasks (of DAGs the user may read) whose destination connection is not serialized."""
        return [(dag.dag_id, task) for dag in self.dags.values() if self._dag_visible(dag.dag_id)
                for task in dag.unlocatable]

    # --- reading ----------------------------------------------------------------------------------

    def _reader(self, destination: Destination) -> tuple[HealthReader, RunFilter]:
        reader = HealthReader(self.engine(destination.conn_id),
                              AuditTarget(destination.table, destination.audit_table, destination.schema))
        reader.present_columns()
        if self.viewer is None:
            return reader, RunFilter.everything()
        return reader, self.viewer.run_filter(destination, reader.dag_ids())

    def failure_text(self, destination: Destination, exc: BaseException) -> str:
        if isinstance(exc, AuditMissing):
            return (f"No audit table {destination.audit_table} yet on connection {destination.conn_id}: "
                    "no sync has recorded a run there.")
        log.warning("BOS sync health: %s on connection %r could not be read: %s", destination.audit_table,
                    destination.conn_id, type(exc).__name__, exc_info=exc)
        if isinstance(exc, BosError):
            return str(exc)
        return (f"Reading {destination.audit_table} on connection {destination.conn_id} failed "
                f"({type(exc).__name__}); the API server log has the details.")

    def table(self, destination: Destination, window: Window, *, full: bool = True) -> TableView:
        """``destination``'s health in ``window`` (``full=False``: latest runs and timeline only)."""
        writers = [(dag, task) for dag, task in destination.writers if self._dag_visible(dag)]
        view = TableView(destination, writers=writers)
        dags = sorted({dag for dag, _ in writers})
        try:
            reader, runs = self._reader(destination)
            view.health = reader.read(window, runs, writer_dags=dags, full=full)
        except Exception as exc:  # noqa: BLE001 - an unreadable destination is shown as such, never fails the page
            view.error = self.failure_text(destination, exc)
            view.no_audit_table = isinstance(exc, AuditMissing)
            return view
        for dag_id in dags:
            info = self.dags.get(dag_id)
            view.per_dag[dag_id] = punctuality(
                timetable=info.timetable if info else None, latest=view.health.latest_by_dag.get(dag_id),
                now=self.now, start_date=info.start_date if info else None, end_date=info.end_date if info else None,
                is_paused=info.is_paused if info else False, max_grace=self.max_grace)
        view.state = worst(list(view.per_dag.values()))
        return view

    def overview(self, window: Window) -> list[TableView]:
        """Every visible destination's latest runs and timeline, read in parallel (one deadline for all)."""
        destinations = self.destinations()
        if not destinations:
            return []
        pool = ThreadPoolExecutor(max_workers=min(8, len(destinations)), thread_name_prefix="bos-health")
        try:
            futures = [pool.submit(self.table, d, window, full=False) for d in destinations]
            wait(futures, timeout=OVERVIEW_DEADLINE_S)
            views = []
            for destination, future in zip(destinations, futures, strict=True):
                if future.done():
                    views.append(future.result())
                else:
                    views.append(TableView(destination, error=(
                        f"Connection {destination.conn_id} did not answer within {OVERVIEW_DEADLINE_S:.0f} s.")))
            return views
        finally:
            pool.shutdown(wait=False, cancel_futures=True)

    def run(self, destination: Destination, run_id: str) -> dict[str, Any] | None:
        """One run's audit row, if the user may see it (None otherwise, or when there is none)."""
        reader, runs = self._reader(destination)
        return reader.run(run_id, runs)
