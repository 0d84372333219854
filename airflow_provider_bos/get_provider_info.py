"""Provider registration, read by Airflow through the ``apache_airflow_provider`` entry point.

Declarative, like Airflow's own providers: the connection form comes from ``conn-fields`` and
``ui-field-behaviour`` (the hook-method widgets are deprecated since Airflow 3.2). Custom fields are
stored in ``Connection.extra``; the secret (initial refresh token or API key) uses the standard
password field so Airflow masks and encrypts it like any other connection password.
"""

from __future__ import annotations

from airflow_provider_bos import __version__

INTEGRATION = "BOS"


def _string(default: str | None = None, **schema: object) -> dict[str, object]:
    spec: dict[str, object] = {"type": ["string", "null"], **schema}
    if default is not None:
        spec["default"] = default
    return spec


def get_provider_info() -> dict[str, object]:
    return {
        "package-name": "airflow-provider-bos",
        "name": "BOS",
        "description": "BOS federated identity reads over MCP with OAuth, streamed source results, "
        "warehouse upserts keyed by record_ref, and completeness sensing.",
        "versions": [__version__],
        "integrations": [
            {
                "integration-name": INTEGRATION,
                "external-doc-url": "https://dfsm.ai/apps/bos/source-results-v1.html",
                "tags": ["service"],
            }
        ],
        "hooks": [{"integration-name": INTEGRATION, "python-modules": ["airflow_provider_bos.hooks.bos"]}],
        "operators": [
            {
                "integration-name": INTEGRATION,
                "python-modules": ["airflow_provider_bos.operators.federated_read"],
            }
        ],
        "sensors": [
            {
                "integration-name": INTEGRATION,
                "python-modules": ["airflow_provider_bos.sensors.completeness"],
            }
        ],
        "plugins": [{"name": "bos", "plugin-class": "airflow_provider_bos.plugins.plugin.BosUiPlugin"}],
        # The Admin -> BOS page's settings on the API server (docs/security.md).
        "config": {
            "bos": {
                "description": "The Admin -> BOS page of the API server.",
                "options": {
                    "allowed_hosts": {
                        "description": "Comma-separated host names or IP addresses the page may reach even when "
                        "they are not public (loopback, private ranges). When set, only these hosts may be used.",
                        "version_added": "0.2.0",
                        "type": "string",
                        "example": "bos.internal.example.com,127.0.0.1",
                        "default": "",
                    },
                    "token_store_conn_ids": {
                        "description": "Comma-separated Airflow connection ids the page may open as token "
                        "stores (a bos Connection's token_store_conn_id), for users who may read them. Any "
                        "other id is refused unless allow_token_store_urls is True.",
                        "version_added": "0.2.0",
                        "type": "string",
                        "example": "bos_token_store",
                        "default": "",
                    },
                    "allow_token_store_urls": {
                        "description": "Let the page open token stores the operator did not list: a database "
                        "URL (token_store_url) from a Connection's extras, or a connection not in "
                        "token_store_conn_ids. Off: only the listed connections and the default SQLite store.",
                        "version_added": "0.2.0",
                        "type": "boolean",
                        "example": "True",
                        "default": "False",
                    },
                },
            },
        },
        "asset-uris": [
            {"schemes": ["sqlite"], "handler": "airflow_provider_bos.assets.tables.sanitize_sqlite_uri"},
            {"schemes": ["mysql"], "handler": "airflow_provider_bos.assets.tables.sanitize_mysql_uri"},
            {"schemes": ["duckdb"], "handler": "airflow_provider_bos.assets.tables.sanitize_duckdb_uri"},
            {"schemes": ["motherduck"], "handler": "airflow_provider_bos.assets.tables.sanitize_motherduck_uri"},
        ],
        "connection-types": [
            {
                "connection-type": "bos",
                "hook-class-name": "airflow_provider_bos.hooks.bos.BosHook",
                "hook-name": "BOS (MCP)",
                "ui-field-behaviour": {
                    "hidden-fields": ["schema", "port", "login", "extra"],
                    "relabeling": {
                        "host": "MCP resource URL",
                        "password": "Refresh token (OAuth) or API key",
                    },
                    "placeholders": {
                        "host": "https://dfsm.ai/mcp/apps/bos/platform",
                        "password": "printed by `airflow-provider-bos connect`",
                    },
                },
                "conn-fields": {
                    "auth_type": {
                        "label": "Auth type",
                        "description": "oauth: a user-granted refresh token (see `airflow-provider-bos connect`); "
                        "api_key: a BOS identity API key in the password field.",
                        "schema": _string("oauth", enum=["oauth", "api_key"]),
                    },
                    "client_id": {
                        "label": "OAuth client ID",
                        "description": "The public client registered by the connect command.",
                        "schema": _string(),
                    },
                    "protocol": {
                        "label": "MCP protocol era",
                        "description": "auto probes server/discover (2026-07-28) and falls back to initialize.",
                        "schema": _string("auto", enum=["auto", "2025-11-25", "2026-07-28"]),
                    },
                    "scopes": {
                        "label": "Scopes",
                        "schema": _string("mcp:tools offline_access"),
                    },
                    "token_store_conn_id": {
                        "label": "Token store SQL connection",
                        "description": "Airflow SQL connection holding rotated OAuth tokens; required when tasks "
                        "run on more than one machine. Empty: a SQLite file under AIRFLOW_HOME.",
                        "schema": _string(),
                    },
                    "context_handle": {
                        "label": "Default context handle",
                        "description": "Empty: the context BOS marks is_default.",
                        "schema": _string(),
                    },
                    "timeout": {
                        "label": "HTTP timeout (seconds)",
                        "description": "Connecting and waiting for BOS to answer a request.",
                        "schema": {"type": ["number", "null"], "default": 30},
                    },
                    "stream_idle_timeout": {
                        "label": "Stream idle timeout (seconds)",
                        "description": "The longest silence allowed on an open result stream (any bytes, "
                        "keepalive comments too, reset it); unlike the HTTP timeout it lets a server take "
                        "minutes to assemble a large final result. The read's deadline still applies.",
                        "schema": {"type": ["number", "null"], "default": 300},
                    },
                    "operation_deadline": {
                        "label": "Operation deadline (seconds)",
                        "description": "The most any call other than a read may take in all (connect, "
                        "tool listing, context discovery, the connection test), retries and stream "
                        "resumptions included. A read is bounded by the operator's read_deadline instead.",
                        "schema": {"type": ["number", "null"], "default": 300},
                    },
                    "max_event_mib": {
                        "label": "Largest event (MiB)",
                        "description": "The most one event or JSON answer from BOS may hold in memory (a "
                        "streamed final result is scanned as it arrives and not held); raise it when a read "
                        "fails with 'exceeded the maximum event size'.",
                        "schema": {"type": ["number", "null"], "default": 512},
                    },
                },
            }
        ],
    }
