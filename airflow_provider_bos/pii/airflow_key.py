"""Where the hash key lives: in Airflow, never in a DAG file (the Airflow glue; imported lazily).

* an Airflow Connection's **password** (any connection type; ``BaseHook.get_connection`` also asks
  the configured secrets backend, so ``connections/<conn_id>`` there works too);
* or an Airflow **Variable** (``Variable.get``, which asks the secrets backend first, then
  ``AIRFLOW_VAR_<NAME>``, then the metadata database).

The value is registered with Airflow's secrets masker as it is read.
"""

from __future__ import annotations

from typing import overload

from airflow_provider_bos.exceptions import BosConfigurationError
from airflow_provider_bos.pii.keyed_hash import PiiKey
from airflow_provider_bos.redaction import add_secret_sink

__all__ = ["key_from_connection", "key_from_variable"]

_HOW_TO_SET = (
    "a long random text, e.g. the output of `python -c 'import secrets; print(secrets.token_urlsafe(48))'`"
)


def _install_airflow_masker() -> None:
    """The key registers itself as a secret (keyed_hash): forward that to Airflow's masker."""
    from airflow.sdk.log import mask_secret

    add_secret_sink(mask_secret)


@overload
def key_from_connection(conn_id: str) -> PiiKey: ...


@overload
def key_from_connection(conn_id: str, *, required: bool) -> PiiKey | None: ...


def key_from_connection(conn_id: str, *, required: bool = True) -> PiiKey | None:
    """The key in the password of Airflow Connection ``conn_id`` (``required=False``: None when there
    is no such connection)."""
    from airflow.sdk import BaseHook
    from airflow.sdk.exceptions import AirflowNotFoundException

    _install_airflow_masker()
    try:
        conn = BaseHook.get_connection(conn_id)
    except AirflowNotFoundException:
        if not required:
            return None
        raise BosConfigurationError(
            f"The Airflow connection {conn_id!r} holding the personal-data hash key does not exist; create "
            f"it (Admin -> Connections, AIRFLOW_CONN_{conn_id.upper()} or the secrets backend) with the "
            f"key as its password: {_HOW_TO_SET}."
        ) from None
    password = conn.password or ""
    if not password.strip():
        raise BosConfigurationError(
            f"The Airflow connection {conn_id!r} has no password; its password must hold the "
            f"personal-data hash key: {_HOW_TO_SET}."
        )
    return PiiKey.from_text(password, source=f"the password of Airflow connection {conn_id!r}")


def key_from_variable(name: str) -> PiiKey:
    """The key in Airflow Variable ``name`` (from the secrets backend, the environment or the database)."""
    from airflow.sdk import Variable

    _install_airflow_masker()
    value = Variable.get(name, default=None)
    if not isinstance(value, str) or not value.strip():
        raise BosConfigurationError(
            f"The Airflow variable {name!r} holding the personal-data hash key is missing or empty; set it "
            f"(secrets backend, AIRFLOW_VAR_{name.upper()} or Admin -> Variables) to {_HOW_TO_SET}."
        )
    return PiiKey.from_text(value, source=f"Airflow variable {name!r}")
