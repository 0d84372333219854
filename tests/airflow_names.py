"""Airflow names the tests use that moved between the supported releases (3.1 to 3.3).

The package's own moved names are in airflow_provider_bos/airflow_compat.py; these are the ones only
the tests need (parsing DAG files as the DAG processor does). Import this module inside a test or
fixture, after tests/conftest.py has set AIRFLOW_HOME.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from airflow.dag_processing.dagbag import BundleDagBag, DagBag, sync_bag_to_db
else:
    try:
        from airflow.dag_processing.dagbag import BundleDagBag, DagBag, sync_bag_to_db
    except ImportError:  # Airflow 3.1
        from airflow.models.dagbag import BundleDagBag, DagBag, sync_bag_to_db

__all__ = ["BundleDagBag", "DagBag", "bundle_dag_bag", "forget_fernet", "sync_bag_to_db"]


def forget_fernet() -> None:
    """Make Airflow's next ``get_fernet()`` read ``[core] fernet_key`` again (it keeps the first one)."""
    from airflow.models import crypto

    if hasattr(crypto.get_fernet, "cache_clear"):
        crypto.get_fernet.cache_clear()
    else:  # Airflow 3.1 keeps it in a module variable
        crypto._fernet = None  # type: ignore[attr-defined]


def bundle_dag_bag(dag_file: Path, bundle_path: Path, bundle_name: str) -> BundleDagBag:
    """The DAGs of one file of a bundle, parsed as the DAG processor does."""
    from airflow_provider_bos.airflow_compat import airflow_version

    # Airflow 3.1's DagBag takes no bundle name (sync_bag_to_db alone is told it).
    named = {"bundle_name": bundle_name} if airflow_version() >= (3, 2) else {}
    return BundleDagBag(dag_folder=str(dag_file), bundle_path=bundle_path, **named)
