"""``airflow-provider-bos``: the user-operated OAuth connect, and token store status.

    airflow-provider-bos connect --conn-id bos_default --resource https://dfsm.ai/mcp/apps/bos/platform
    airflow-provider-bos token-store show --conn-id bos_default
    airflow-provider-bos token-store reseal [--token-store-conn-id ID | --token-store-url URL]
    airflow-provider-bos erase --conn-id warehouse --table bos_records --record-ref <ref> [...]
    airflow-provider-bos pii-hash --key-conn-id bos_pii_key --field email <value> [...]

``connect`` discovers the authorization server, registers a public client (unless ``--client-id``),
prints the sign-in URL (and opens a browser when there is one), receives the callback on a
127.0.0.1 listener (or, with ``--redirect-uri``, reads the callback URL you paste), validates it,
exchanges the code, stores the grant in the token store, and prints the Airflow Connection to
create. Secrets are shown as ``***`` unless ``--show-secrets``.

``token-store reseal`` (an admin's command, once after upgrading from a release that wrote
``enc:v1:`` rows) re-seals every such row of a store to the row it is in, in one transaction; the
store refuses ``enc:v1:`` rows on read until then.

``erase`` (:mod:`.cli_erase`) deletes a person's rows on request; ``pii-hash`` (:mod:`.cli_pii`)
prints the keyed hash a personal-data policy stores for a value, for look-ups.

Airflow is imported lazily and only here (for ``--token-store-conn-id``, ``--save-connection`` and
Airflow's Fernet key); the ``auth`` core never imports it.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import shlex
import sys
import time
import traceback
import warnings
import webbrowser
from collections.abc import Iterator, Sequence
from datetime import UTC, datetime
from typing import Any, TextIO
from urllib.parse import parse_qsl, urljoin, urlsplit

import httpx
from sqlalchemy.engine import make_url

from airflow_provider_bos.auth.connect import ConnectOutcome, run_connect_flow
from airflow_provider_bos.auth.grants import DEFAULT_SCOPES
from airflow_provider_bos.auth.token_store import Cipher, SqlTokenStore, default_token_store_url
from airflow_provider_bos.auth.urls import parse_url
from airflow_provider_bos.exceptions import BosAuthError, BosConfigurationError, BosError, one_line
from airflow_provider_bos.hooks.connections import airflow_fernet_cipher

__all__ = ["main", "build_parser", "connection_document", "airflow_fernet_cipher", "token_store_for"]

PROG = "airflow-provider-bos"
MASK = "***"

log = logging.getLogger(__name__)


# --- Airflow glue (lazy) -------------------------------------------------------------------------


def _airflow_sql_engine(conn_id: str) -> Any:
    from airflow_provider_bos.hooks.connections import engine_for_connection

    return engine_for_connection(conn_id)


def token_store_for(
    *, url: str | None, conn_id: str | None, cipher: Cipher | None
) -> tuple[SqlTokenStore, str]:
    """The token store the options name, and a printable (password-free) description of it."""
    if url and conn_id:
        raise BosConfigurationError("Pass either --token-store-url or --token-store-conn-id, not both.")
    if conn_id:
        store = SqlTokenStore(_airflow_sql_engine(conn_id), cipher=cipher)
        return store, f"Airflow connection {conn_id!r}"
    target = url or default_token_store_url()
    store = SqlTokenStore(target, cipher=cipher)
    return store, make_url(target).render_as_string(hide_password=True)


_TOKEN_STORE_KEYS = ("token_store_conn_id", "token_store_url")


def save_bos_connection(conn_id: str, *, conn_type: str, host: str, extra: dict[str, Any]) -> None:
    """Create the ``bos`` Connection a sign-in names, or update it in place, holding no secret.

    Only what the sign-in decides is set (type, host, the token store the grant went to, the given
    extra fields); the rest the user set (description, context handle, timeouts...) is kept. The
    connect command and the Admin -> BOS page both save through here.
    """
    from airflow.models.connection import Connection
    from airflow.utils.session import create_session
    from sqlalchemy import select

    from airflow_provider_bos.hooks.bos import extra_of

    with create_session() as session:
        conn = session.scalars(select(Connection).where(Connection.conn_id == conn_id)).one_or_none()
        if conn is None:
            conn = Connection(conn_id=conn_id, conn_type=conn_type)
            session.add(conn)
            merged: dict[str, Any] = {}
        else:
            merged = extra_of(conn)
            # The grant is in the store this sign-in used (named in ``extra``, or the default):
            # an older store setting left beside it would send tasks to a grant that is not there.
            for key in _TOKEN_STORE_KEYS:
                merged.pop(key, None)
        merged.update(extra)
        conn.conn_type = conn_type
        conn.host = host  # the whole resource URL: the URI form's path (schema) and port go
        conn.schema = None
        conn.port = None
        conn.password = None
        conn.extra = json.dumps(merged)


# --- output --------------------------------------------------------------------------------------


def connection_document(
    outcome: ConnectOutcome,
    *,
    token_store_url: str | None,
    token_store_conn_id: str | None,
    show_secrets: bool,
) -> dict[str, Any]:
    """The ``conn_type=bos`` Connection as Airflow's JSON form (``AIRFLOW_CONN_<ID>``)."""
    extra: dict[str, Any] = {
        "auth_type": "oauth",
        "client_id": outcome.client_id,
        "protocol": "auto",
        "scopes": outcome.tokens.scope or DEFAULT_SCOPES,
    }
    if token_store_conn_id:
        extra["token_store_conn_id"] = token_store_conn_id
    if token_store_url:
        extra["token_store_url"] = (
            token_store_url
            if show_secrets
            else make_url(token_store_url).render_as_string(hide_password=True)
        )
    refresh_token = outcome.tokens.refresh_token or ""
    return {
        "conn_type": "bos",
        "host": outcome.info.resource,
        "password": refresh_token if show_secrets else MASK,
        "extra": extra,
    }


def _env_name(conn_id: str) -> str:
    return "AIRFLOW_CONN_" + conn_id.upper()


def _iso(epoch: float | None) -> str:
    if epoch is None:
        return "never (no expires_in)"
    return datetime.fromtimestamp(epoch, UTC).isoformat(timespec="seconds")


# --- presenting the authorization URL -------------------------------------------------------------


def _same_target(url: str, redirect_uri: str) -> bool:
    try:
        a, b = parse_url(url), parse_url(redirect_uri)
    except ValueError:
        return False
    return a.origin == b.origin and a.path == b.path


@contextlib.contextmanager
def _quiet_http_logs() -> Iterator[None]:
    """Silence httpx/httpcore below WARNING while following: httpx logs every request URL at INFO,
    and the last one is the callback with its authorization code."""
    loggers = [logging.getLogger(name) for name in ("httpx", "httpcore")]
    levels = [lg.level for lg in loggers]
    for lg in loggers:
        lg.setLevel(max(lg.getEffectiveLevel(), logging.WARNING))
    try:
        yield
    finally:
        for lg, level in zip(loggers, levels, strict=True):
            lg.setLevel(level)


def auto_follow(authorization_url: str, *, deliver: bool, timeout_s: float = 30.0) -> str | None:
    """Testing aid: follow the authorization URL with httpx instead of a browser.

    Only meaningful against a server that consents automatically (the reference server). Follows
    redirects until one targets the ``redirect_uri``; then either requests it (``deliver``: the
    loopback listener receives it like from a browser) or returns it (paste mode).
    """
    redirect_uri = dict(parse_qsl(urlsplit(authorization_url).query)).get("redirect_uri", "")
    url = authorization_url
    # A browser's hops are not logged; httpx's INFO and httpcore's DEBUG lines would show the code.
    with _quiet_http_logs(), httpx.Client(timeout=timeout_s) as browser:
        for _ in range(10):
            response = browser.get(url, follow_redirects=False)
            location = response.headers.get("location")
            if not response.is_redirect or not location:
                raise BosAuthError(
                    f"--auto-follow: {urlsplit(url).path} answered HTTP {response.status_code} "
                    "without a redirect; "
                    "auto-follow works only with a server that consents automatically."
                )
            url = urljoin(url, location)
            if _same_target(url, redirect_uri):
                if deliver:
                    browser.get(url, follow_redirects=False)
                    return None
                return url
    raise BosAuthError("--auto-follow: too many redirects.")


def _presenter(args: argparse.Namespace, out: TextIO) -> Any:
    def present(authorization_url: str) -> str | None:
        print("Sign in to BOS by opening this URL in a browser:\n", file=out)
        print(f"  {authorization_url}\n", file=out, flush=True)
        if args.auto_follow:
            return auto_follow(authorization_url, deliver=args.redirect_uri is None)
        if not args.no_browser:
            with contextlib.suppress(Exception):  # no browser is fine: the URL is printed
                webbrowser.open(authorization_url)
        if args.redirect_uri is None:
            print(f"Waiting up to {args.timeout:g} s for the sign-in callback...", file=out, flush=True)
        return None

    return present


def _read_pasted(stdin: TextIO, out: TextIO) -> Any:
    def read() -> str:
        print("After signing in, paste the full URL your browser was redirected to:", file=out, flush=True)
        line = stdin.readline()
        if not line.strip():
            raise BosConfigurationError("No callback URL was pasted.")
        return line.strip()

    return read


# --- commands ------------------------------------------------------------------------------------


def _cmd_connect(args: argparse.Namespace, out: TextIO, stdin: TextIO) -> int:
    if args.token_store_url and args.token_store_conn_id:
        raise BosConfigurationError("Pass either --token-store-url or --token-store-conn-id, not both.")
    cipher = airflow_fernet_cipher()
    # Open the store before signing in: a broken store is better found before the code is spent.
    store, store_label = token_store_for(
        url=args.token_store_url, conn_id=args.token_store_conn_id, cipher=cipher
    )
    try:
        store.ensure_table()
        outcome = run_connect_flow(
            args.resource,
            present=_presenter(args, out),
            client_id=args.client_id,
            redirect_uri=args.redirect_uri,
            read_pasted_callback=_read_pasted(stdin, out),
            port=args.port,
            timeout_s=args.timeout,
        )
        tokens = outcome.tokens
        if not tokens.refresh_token:
            raise BosAuthError(
                "BOS issued no refresh token (the offline_access scope was not granted); "
                "a scheduled connection needs one. Run connect again and approve offline access."
            )
        grant = store.seed(
            args.conn_id,
            client_id=outcome.client_id,
            token_endpoint=outcome.info.token_endpoint,
            resource=outcome.info.resource,
            scope=tokens.scope or DEFAULT_SCOPES,
            refresh_token=tokens.refresh_token,
            access_token=tokens.access_token,
            expires_at=tokens.expires_at,
            force=True,
        )
    finally:
        store.dispose()

    print(f"\nConnected {args.conn_id!r} to {outcome.info.resource}", file=out)
    print(f"  issuer:        {outcome.info.issuer}", file=out)
    print(
        f"  client_id:     {outcome.client_id}{' (registered now)' if outcome.registered else ''}", file=out
    )
    print(
        f"  token store:   {store_label}, table {store.table_name}"
        f"{', encrypted with Airflow Fernet key' if cipher else ', NOT encrypted (no Airflow fernet_key)'}",
        file=out,
    )
    print(
        f"  grant:         generation {grant.generation}, access token expires {_iso(grant.expires_at)}",
        file=out,
    )

    def render(show: bool) -> str:
        document = connection_document(
            outcome,
            token_store_url=args.token_store_url,
            token_store_conn_id=args.token_store_conn_id,
            show_secrets=show,
        )
        return json.dumps(document, separators=(",", ":"))

    shown = render(args.show_secrets)
    print(f"\nAirflow Connection (JSON, usable as {_env_name(args.conn_id)}):\n", file=out)
    print(f"  {shown}\n", file=out)
    print(f"  export {_env_name(args.conn_id)}={shlex.quote(shown)}", file=out)
    print(f"  airflow connections add {shlex.quote(args.conn_id)} --conn-json {shlex.quote(shown)}", file=out)
    if not args.show_secrets:
        print(
            "\nThe refresh token is shown as *** ; rerun with --show-secrets to print it, or use "
            "--save-connection to write the Connection directly.",
            file=out,
        )
    if args.save_connection:
        # The token store is the source of truth: the saved Connection holds no secret (as the
        # Admin -> BOS page writes it), so no copy of the refresh token can go stale and re-seed.
        document = json.loads(render(True))
        save_bos_connection(args.conn_id, conn_type=document["conn_type"], host=document["host"],
                            extra=document["extra"])
        print(
            f"\nSaved Airflow connection {args.conn_id!r} to the Airflow metadata database "
            "(no secret in it: tasks take the grant from the token store).",
            file=out,
        )
    out.flush()
    return 0


def _cmd_token_store_show(args: argparse.Namespace, out: TextIO, stdin: TextIO) -> int:
    store, label = token_store_for(
        url=args.token_store_url, conn_id=args.token_store_conn_id, cipher=airflow_fernet_cipher()
    )
    try:
        raw = store.raw_row(args.conn_id)
    finally:
        store.dispose()
    if raw is None:
        print(f"No grant stored for {args.conn_id!r} in {label}.", file=out)
        return 1
    encrypted = str(raw.get("refresh_token") or "").startswith("enc:")
    status = {
        "conn_id": raw["key"],
        "token_store": label,
        "client_id": raw["client_id"],
        "resource": raw["resource"],
        "scope": raw["scope"],
        "generation": raw["generation"],
        "expires_at": _iso(raw["expires_at"]),
        "access_token_valid": raw["expires_at"] is None or raw["expires_at"] > time.time(),
        "updated_at": _iso(raw["updated_at"]),
        "has_refresh_token": raw["refresh_token"] is not None,
        "encrypted": encrypted,
    }
    print(json.dumps(status, indent=2), file=out)
    return 0


def _cmd_token_store_reseal(args: argparse.Namespace, out: TextIO, stdin: TextIO) -> int:
    cipher = airflow_fernet_cipher()
    if cipher is None:
        raise BosConfigurationError(
            "Re-sealing needs Airflow's [core] fernet_key (the key the enc:v1 rows were written with); "
            "none is configured here."
        )
    store, label = token_store_for(url=args.token_store_url, conn_id=args.token_store_conn_id, cipher=cipher)
    try:
        report = store.reseal_legacy()
    finally:
        store.dispose()
    print(f"Token store {label}, table {store.table_name}:", file=out)
    if not report.resealed and not report.refused:
        print("  no row of the earlier format (enc:v1); nothing to do.", file=out)
    for key, resource, endpoint in report.resealed:
        print(f"  re-sealed {key!r}: resource {resource}, token endpoint {endpoint}", file=out)
    for key, reason in report.refused:
        print(f"  NOT re-sealed {key!r}: {reason} (airflow-provider-bos connect --conn-id {key})", file=out)
    if report.resealed:
        print(
            "Check that each re-sealed row names the resource and token endpoint its Connection should: "
            "a row a table writer moved a token into before this command ran looks like any other.",
            file=out,
        )
    out.flush()
    return 1 if report.refused else 0


def _add_store_options(parser: argparse.ArgumentParser) -> None:
    group = parser.add_mutually_exclusive_group()
    group.add_argument(
        "--token-store-url",
        metavar="URL",
        help="SQLAlchemy URL of the token store (default: SQLite file under AIRFLOW_HOME).",
    )
    group.add_argument(
        "--token-store-conn-id",
        metavar="ID",
        help="Airflow SQL connection holding the token store (for multi-host deployments).",
    )


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog=PROG, description="BOS provider tools: OAuth connect, token store, erasure, personal-data hashes."
    )
    parser.add_argument(
        "--debug", action="store_true",
        help="On an error, print the full chain of causes (tracebacks) above the error line, and log at debug level.",
    )
    commands = parser.add_subparsers(dest="command", required=True)

    connect = commands.add_parser("connect", help="Sign in to BOS and print the Airflow Connection.")
    connect.add_argument(
        "--conn-id", default="bos_default", help="Airflow connection id (default bos_default)."
    )
    connect.add_argument("--resource", required=True, metavar="URL", help="The BOS MCP resource URL.")
    connect.add_argument("--client-id", help="Use this registered client instead of dynamic registration.")
    connect.add_argument(
        "--redirect-uri",
        metavar="URL",
        help="Paste mode: a browser-reachable HTTPS redirect URI you own; paste the callback URL.",
    )
    connect.add_argument(
        "--port", type=int, default=0, help="Loopback listener port (default: any free port)."
    )
    _add_store_options(connect)
    connect.add_argument("--no-browser", action="store_true", help="Only print the sign-in URL.")
    connect.add_argument("--show-secrets", action="store_true", help="Print the refresh token in the output.")
    connect.add_argument(
        "--timeout", type=float, default=300.0, help="Seconds to wait for the callback (300)."
    )
    connect.add_argument(
        "--save-connection",
        action=argparse.BooleanOptionalAction,
        default=False,
        help="Write the Connection to Airflow's metadata database (default: off).",
    )
    connect.add_argument("--auto-follow", action="store_true", help=argparse.SUPPRESS)
    connect.set_defaults(handler=_cmd_connect)

    store = commands.add_parser(
        "token-store", help="Inspect the token store, or re-seal its rows of the earlier format."
    )
    store_commands = store.add_subparsers(dest="store_command", required=True)
    show = store_commands.add_parser("show", help="Print a grant's non-secret status.")
    show.add_argument("--conn-id", default="bos_default")
    _add_store_options(show)
    show.set_defaults(handler=_cmd_token_store_show)
    reseal = store_commands.add_parser(
        "reseal",
        help="Re-seal every row of the earlier format (enc:v1) to its row, in one step (admin, once after upgrading).",
    )
    _add_store_options(reseal)
    reseal.set_defaults(handler=_cmd_token_store_reseal)

    from airflow_provider_bos.cli_erase import add_erase_parser

    add_erase_parser(commands)

    from airflow_provider_bos.cli_pii import add_pii_apply_parser, add_pii_hash_parser, add_pii_keygen_parser

    add_pii_keygen_parser(commands)
    add_pii_hash_parser(commands)
    add_pii_apply_parser(commands)
    return parser


def _quiet_airflow_31_deprecations() -> None:
    """Airflow 3.1 under SQLAlchemy 2.1 and newer providers prints deprecation notices (on every
    connection lookup) that are not the user's to act on and would bury the one line an error prints.
    Airflow puts its own warning filters in front when its configuration is imported: ours go after."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        if tuple(int(part) for part in version("apache-airflow-core").split(".")[:2]) >= (3, 2):
            return
        import airflow.configuration  # noqa: F401 - its filters first, so that ours win
    except (PackageNotFoundError, ImportError, ValueError):
        return
    for category in (DeprecationWarning, FutureWarning):
        warnings.filterwarnings("ignore", category=category, module=r"airflow\.")


def main(
    argv: Sequence[str] | None = None, *, stdout: TextIO | None = None, stdin: TextIO | None = None
) -> int:
    """Console entry point; returns the exit status (0 ok, 1 BOS error, 2 usage).

    A BOS error prints one line, ``error: <what failed and what to do>``, on stderr; the chain of
    causes above it only with ``--debug`` (or when this logger is at debug level).
    """
    args = build_parser().parse_args(argv)
    if args.debug:
        logging.basicConfig(level=logging.DEBUG)
        log.setLevel(logging.DEBUG)
    else:
        _quiet_airflow_31_deprecations()
    out = stdout or sys.stdout
    try:
        return int(args.handler(args, out, stdin or sys.stdin))
    except BosError as exc:
        if args.debug or log.isEnabledFor(logging.DEBUG):
            traceback.print_exception(exc, file=sys.stderr)
        print(f"{PROG}: error: {one_line(exc)}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print(f"{PROG}: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
