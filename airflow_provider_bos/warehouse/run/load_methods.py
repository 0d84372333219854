"""The loader of each load method: a dialect names how its rows travel (data, in its capabilities);
the run maps that to the object that moves them, so the dialects import nothing of the run."""

from __future__ import annotations

from airflow_provider_bos.warehouse.dialects.capabilities import LoadMethod
from airflow_provider_bos.warehouse.run.file_load import FILE_LOADER
from airflow_provider_bos.warehouse.run.loads import COPY_LOADER, ROWS_LOADER, Loader

__all__ = ["loader_for"]

_LOADERS: dict[LoadMethod, Loader] = {
    LoadMethod.ROWS: ROWS_LOADER,
    LoadMethod.COPY: COPY_LOADER,
    LoadMethod.FILE: FILE_LOADER,
}


def loader_for(method: LoadMethod) -> Loader:
    """The loader that moves rows by ``method``."""
    return _LOADERS[method]
