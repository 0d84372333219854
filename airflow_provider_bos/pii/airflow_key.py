"""Where the hash key lives: in Airflow, never in a DAG file (the Airflow glue; imported lazily).

* an Airflow Connection's **password** (any connection type; ``BaseHook.get_connection`` also asks
  the configured secrets backend, so ``connections/<conn_id>`` there works too);
* or an Airflow **Variable** (``Variable.get``, which asks the secrets backend first, then
  ``AIRFLOW_VAR_<NAME>``, then the metadata database) whose **name Airflow masks**: the REST API
  (``GET /api/v2/variables``) and the UI show a Variable's value in clear to every role that may list
  Variables (Op among them) unless its name holds one of Airflow's sensitive words (``secret``,
  ``password``, ...: ``DEFAULT_SENSITIVE_FIELDS`` of its secrets masker), where a Connection's password
  is always shown as ``***``. A Variable named otherwise (``bos_pii_key``) is refused before it is read.

The value is registered with Airflow's secrets masker as it is read.
"""

from __future__ import annotations

import re
from typing import overload

from airflow_provider_bos.exceptions import BosConfigurationError
from airflow_provider_bos.pii.keyed_hash import PiiKey
from airflow_provider_bos.redaction import add_secret_sink

__all__ = ["MASKED_VARIABLE_NAME", "airflow_masks_variable", "key_from_connection", "key_from_variable"]

_HOW_TO_SET = "a long random text, e.g. the output of `airflow-provider-bos pii-keygen`"
#: A Variable name Airflow masks, for messages.
MASKED_VARIABLE_NAME = "bos_pii_secret_key"
# Airflow's own list (airflow.sdk._shared.secrets_masker.DEFAULT_SENSITIVE_FIELDS, Airflow 3.x), used
# only where that module cannot be imported.
_SENSITIVE_FALLBACK = frozenset((
    "access_key", "access_token", "api_key", "apikey", "auth_header", "authorization", "bearer",
    "connection_string", "dsn", "keyfile_dict", "passphrase", "passwd", "password", "private_key", "proxies",
    "proxy", "proxy_password", "secret", "service_account", "service_key", "token", "webhook_url",
))


def _sensitive_fragments() -> frozenset[str]:
    """The name fragments every Airflow masks (its defaults; a deployment's
    ``[core] sensitive_var_conn_names`` may add more, but only on the servers it is configured on)."""
    try:
        from airflow.sdk._shared.secrets_masker import DEFAULT_SENSITIVE_FIELDS
    except ImportError:
        try:
            from airflow._shared.secrets_masker import DEFAULT_SENSITIVE_FIELDS
        except ImportError:
            return _SENSITIVE_FALLBACK
    return frozenset(DEFAULT_SENSITIVE_FIELDS)


def _hiding_is_off() -> bool:
    """This installation's ``[core] hide_sensitive_var_conn_fields`` is False: no Variable is masked."""
    try:
        from airflow.configuration import conf
    except ImportError:  # the Task SDK alone: nothing to read
        return False
    try:
        return not conf.getboolean("core", "hide_sensitive_var_conn_fields", fallback=True)
    except Exception:  # noqa: BLE001 - a value conf cannot read is none we know to be off
        return False


def airflow_masks_variable(name: str) -> bool:
    """Airflow's API and UI show Variable ``name``'s value as ``***`` (its secrets masker's rule: the
    name lower-cased, non-word characters as ``_``, holding one of its sensitive fragments)."""
    normalized = re.sub(r"\W+", "_", name.strip().lower())
    return any(fragment in normalized for fragment in _sensitive_fragments())


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
    from airflow_provider_bos.hooks.connections import airflow_connection, not_found

    _install_airflow_masker()
    conn = airflow_connection(conn_id)
    if conn is None:
        if not required:
            return None
        raise BosConfigurationError(f"{not_found(conn_id, ' holding the personal-data hash key')} Its password "
                                    f"is the key: {_HOW_TO_SET}.")
    password = conn.password or ""
    if not password.strip():
        raise BosConfigurationError(
            f"The Airflow connection {conn_id!r} has no password; its password must hold the "
            f"personal-data hash key: {_HOW_TO_SET}."
        )
    return PiiKey.from_text(password, source=f"the password of Airflow connection {conn_id!r}")


def key_from_variable(name: str) -> PiiKey:
    """The key in Airflow Variable ``name`` (from the secrets backend, the environment or the database).

    :raises BosConfigurationError: ``name`` is one Airflow does not mask (its value would be shown in
        clear by the REST API and the UI), or the Variable is missing or empty.
    """
    if not airflow_masks_variable(name):
        raise BosConfigurationError(
            f"The Airflow variable {name!r} cannot hold the personal-data hash key: Airflow does not mask a "
            f"variable of that name, so its REST API (GET /api/v2/variables) and UI show the key in clear to "
            f"every role that may list variables. Keep the key in a Connection's password (pii_key_conn_id), "
            f"or in a variable whose name Airflow masks, e.g. {MASKED_VARIABLE_NAME!r} (a name holding "
            "'secret' or 'password')."
        )
    if _hiding_is_off():
        raise BosConfigurationError(
            f"The Airflow variable {name!r} cannot hold the personal-data hash key: this installation sets "
            "[core] hide_sensitive_var_conn_fields = False, so Airflow shows every variable's value in clear. "
            "Keep the key in a Connection's password (pii_key_conn_id)."
        )
    from airflow.sdk import Variable

    _install_airflow_masker()
    value = Variable.get(name, default=None)
    if not isinstance(value, str) or not value.strip():
        raise BosConfigurationError(
            f"The Airflow variable {name!r} holding the personal-data hash key is missing or empty; set it "
            f"(secrets backend, AIRFLOW_VAR_{name.upper()} or Admin -> Variables) to {_HOW_TO_SET}."
        )
    return PiiKey.from_text(value, source=f"Airflow variable {name!r}")
