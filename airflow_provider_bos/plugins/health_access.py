"""Who sees what on the sync-health page: Airflow's auth manager, asked per DAG and per connection.

- A destination that DAGs write is shown to a user whom the auth manager lets read (``GET``) at
  least one of those DAGs; to anyone else, nothing of it (its URLs answer 404).
- A destination listed in ``[bos] health_destinations`` that no DAG writes is shown only to users
  who may edit (``PUT``) its Connection, the right the Admin -> BOS page asks for (with
  SimpleAuthManager: the Op and Admin roles). It holds runs no DAG permission covers.
- Within a destination shown, a run is shown when its DAG is one the user may read. Runs recorded
  without a DAG id (a script calling the writer), and runs of a DAG Airflow no longer knows, are
  shown only to those who may edit the destination's Connection. Runs of a DAG the user may not
  read are never shown, whoever they are.

The user's readable DAG ids come from the auth manager's ``get_authorized_dag_ids`` (Airflow's own
list views filter with it); Connection rights from ``is_authorized_connection`` per connection id,
as the BOS page asks them (:func:`.access.is_authorized`).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from airflow_provider_bos.plugins.access import is_authorized
from airflow_provider_bos.plugins.health_discovery import Destination
from airflow_provider_bos.plugins.health_queries import RunFilter

__all__ = ["HEALTH_PERMISSION_NOTE", "Viewer"]

HEALTH_PERMISSION_NOTE = (
    "You see a table when Airflow's auth manager lets you read a DAG that writes it, and only the runs "
    "of DAGs you may read; a table no DAG writes (listed in [bos] health_destinations), and runs recorded "
    "without a DAG, only when you may edit its Connection."
)


@dataclass
class Viewer:
    """One request's user: the DAGs they may read, every DAG Airflow knows, and their Connection rights."""

    user: Any
    readable: frozenset[str]
    known: frozenset[str]
    _edit: dict[str, bool] = field(default_factory=dict)

    @classmethod
    def of(cls, user: Any) -> Viewer:
        import sqlalchemy as sa
        from airflow.api_fastapi.app import get_auth_manager
        from airflow.models.dag import DagModel
        from airflow.utils.session import create_session

        readable = get_auth_manager().get_authorized_dag_ids(user=user, method="GET")
        with create_session() as session:
            known = set(session.scalars(sa.select(DagModel.dag_id)))
        return cls(user, frozenset(readable), frozenset(known))

    def may_edit(self, conn_id: str) -> bool:
        if conn_id not in self._edit:
            self._edit[conn_id] = is_authorized(self.user, conn_id, "PUT")
        return self._edit[conn_id]

    def sees(self, destination: Destination) -> bool:
        if destination.writers:
            return any(dag_id in self.readable for dag_id in destination.writer_dags)
        return self.may_edit(destination.conn_id)

    def run_filter(self, destination: Destination, recorded: Iterable[str | None]) -> RunFilter:
        """The runs of ``destination`` this user may see, given the DAG ids its audit rows carry."""
        editor = self.may_edit(destination.conn_id)
        allowed = {
            dag_id for dag_id in recorded
            if dag_id is not None and (dag_id in self.readable or (editor and dag_id not in self.known))
        }
        return RunFilter(frozenset(allowed), without_dag=editor)
