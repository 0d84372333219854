"""The Airflow names that moved between the supported releases (3.1, 3.2, 3.3), in one place.

The provider supports ``apache-airflow>=3.1,<3.4``. Airflow 3.1's Task SDK does not define the task
exceptions yet (airflow-core does), and its serializer is ``SerializedDAG`` with ``decode_timetable``
beside it; later releases moved each. Everything else the provider imports from Airflow has the same
name on every supported release, except the connection form's custom fields, which Airflow reads
from the provider info only from 3.2 on (docs/deployment.md).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from airflow.sdk.exceptions import AirflowFailException, AirflowNotFoundException, AirflowSkipException
else:
    try:
        from airflow.sdk.exceptions import (
            AirflowFailException,
            AirflowNotFoundException,
            AirflowSkipException,
        )
    except ImportError:  # Airflow 3.1: the Task SDK raises airflow-core's classes
        from airflow.exceptions import AirflowFailException, AirflowNotFoundException, AirflowSkipException

__all__ = [
    "AirflowFailException",
    "AirflowNotFoundException",
    "AirflowSkipException",
    "airflow_version",
    "dag_from_serialized",
    "decode_timetable",
]


def airflow_version() -> tuple[int, int]:
    """The installed Airflow's (major, minor)."""
    from airflow import __version__

    major, minor = __version__.split(".")[:2]
    return int(major), int(minor)


def decode_timetable(encoded: dict[str, Any]) -> Any:
    """A timetable from its serialized form (``airflow.serialization.decoders`` from Airflow 3.2 on)."""
    try:
        from airflow.serialization.decoders import decode_timetable as decode
    except ImportError:  # Airflow 3.1
        from airflow.serialization.serialized_objects import decode_timetable as decode
    return decode(encoded)


def dag_from_serialized(data: dict[str, Any]) -> Any:
    """A DAG from a serialized DAG document (``DagSerialization`` from Airflow 3.2 on)."""
    serializer: Any
    try:
        from airflow.serialization.serialized_objects import DagSerialization

        serializer = DagSerialization
    except ImportError:  # Airflow 3.1
        from airflow.serialization.serialized_objects import SerializedDAG

        serializer = SerializedDAG
    return serializer.from_dict(data)
