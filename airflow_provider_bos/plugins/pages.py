"""HTML of the BOS page. Every value is escaped; no token, code or verifier is ever passed in."""

from __future__ import annotations

import base64
import hashlib
from collections.abc import Sequence
from datetime import UTC, datetime
from html import escape
from urllib.parse import quote

from airflow_provider_bos.models import BosContext
from airflow_provider_bos.plugins.grant_status import API_KEY_MODE, NOT_CONNECTED, GrantStatus

__all__ = ["CHECK_DISABLED_NOTE", "PERMISSION_NOTE", "contexts_page", "message_page", "status_page", "style_hash"]

PERMISSION_NOTE = (
    "Only users whom Airflow's auth manager allows to edit Connections can use this page "
    "(is_authorized_connection with method PUT, per connection; creating a new Connection also needs "
    "POST, and a token store connection needs GET). With the default SimpleAuthManager that is the Op "
    "and Admin roles."
)

_STYLE = """
body{font-family:system-ui,-apple-system,"Segoe UI",Roboto,sans-serif;margin:1.5rem;color:#1a202c}
h1{font-size:1.4rem;margin:0 0 1rem} h2{font-size:1.1rem;margin:1.5rem 0 .5rem}
table{border-collapse:collapse;width:100%;font-size:.9rem}
th,td{border-bottom:1px solid #e2e8f0;padding:.45rem .6rem;text-align:left;vertical-align:top}
th{background:#f7fafc;font-weight:600}
.state{font-weight:600;white-space:nowrap} .state-connected{color:#2f855a}
.state-reconnect-needed,.state-check-failed{color:#c53030} .state-not-connected{color:#975a16}
.detail{color:#4a5568;font-size:.8rem} .muted{color:#718096;font-size:.85rem}
.notice{background:#f0fff4;border:1px solid #9ae6b4;padding:.6rem .8rem;margin-bottom:1rem}
.error{background:#fff5f5;border:1px solid #feb2b2;padding:.6rem .8rem;margin-bottom:1rem}
form.inline{display:inline} button{padding:.3rem .8rem;border:1px solid #3182ce;background:#3182ce;
color:#fff;border-radius:4px;cursor:pointer} button.secondary{background:#fff;color:#3182ce}
label{display:block;margin:.4rem 0 .1rem;font-size:.9rem} input{padding:.3rem;width:28rem;max-width:100%}
"""


def _iso(epoch: float | None) -> str:
    if epoch is None:
        return "-"
    return datetime.fromtimestamp(float(epoch), UTC).strftime("%Y-%m-%d %H:%M:%S UTC")


def _layout(title: str, body: str) -> str:
    return (
        f'<!doctype html><html lang="en"><head><meta charset="utf-8"><title>{escape(title)}</title>'
        f'<meta name="referrer" content="same-origin"><style>{_STYLE}</style></head>'
        f"<body>{body}</body></html>"
    )


def _hidden_csrf(csrf: str) -> str:
    return f'<input type="hidden" name="csrf_token" value="{escape(csrf)}">'


def style_hash() -> str:
    """The CSP source of the page's one inline style sheet (no other inline content is allowed)."""
    digest = base64.b64encode(hashlib.sha256(_STYLE.encode("utf-8")).digest()).decode("ascii")
    return f"'sha256-{digest}'"


CHECK_DISABLED_NOTE = "Checking is off: Airflow's [core] test_connection is not Enabled."


def _check_button(csrf: str, home: str, conn_path: str, check_mode: str) -> str:
    if check_mode == "hidden":
        return ""
    if check_mode != "enabled":
        return (
            f'<button class="secondary" type="button" data-action="check" disabled '
            f'title="{escape(CHECK_DISABLED_NOTE)}">Check</button>'
        )
    return (
        f'<form class="inline" method="post" action="{escape(home)}connections/{conn_path}/check">'
        f'{_hidden_csrf(csrf)}<button class="secondary" type="submit" data-action="check">Check</button>'
        "</form>"
    )


def _row(status: GrantStatus, csrf: str, home: str, check_mode: str) -> str:
    conn = escape(status.conn_id)
    # In a URL path: Airflow allows "/" and "#" in a conn_id (the routes take the rest of the path).
    conn_path = escape(quote(status.conn_id, safe=""))
    slug = status.state.replace(" ", "-").lower()
    actions = ""
    if status.state != API_KEY_MODE:
        label = "Connect" if status.state == NOT_CONNECTED else "Reconnect"
        actions += (
            f'<form class="inline" method="post" action="{escape(home)}connections/{conn_path}/connect">'
            f'{_hidden_csrf(csrf)}<button type="submit" data-action="connect">{label}</button></form> '
        )
    actions += _check_button(csrf, home, conn_path, check_mode)
    detail = f'<div class="detail">{escape(status.detail)}</div>' if status.detail else ""
    generation = "-" if status.generation is None else str(status.generation)
    return (
        f'<tr data-conn-id="{conn}"><td>{conn}</td><td>{escape(status.resource)}</td>'
        f'<td><span class="state state-{slug}" data-state="{escape(status.state)}">'
        f"{escape(status.state)}</span>"
        f"{detail}</td><td>{_iso(status.expires_at)}</td><td>{_iso(status.last_refresh)}</td>"
        f"<td>{generation}</td><td>{escape(status.client_id or '-')}</td>"
        f"<td>{escape(status.token_store or '-')}</td><td>{actions}</td></tr>"
    )


def status_page(
    statuses: Sequence[GrantStatus],
    *,
    csrf: str,
    home: str,
    notice: str | None = None,
    check_mode: str = "enabled",
) -> str:
    rows = "".join(_row(s, csrf, home, check_mode) for s in statuses) or (
        '<tr><td colspan="9" class="muted">No connection of type bos yet: connect one below.</td></tr>'
    )
    notice_html = f'<div class="notice" role="status">{escape(notice)}</div>' if notice else ""
    body = f"""<h1>BOS connections</h1>{notice_html}
<table><thead><tr><th>Connection</th><th>MCP resource</th><th>Grant</th><th>Access token expires</th>
<th>Last refresh / connect</th><th>Generation</th><th>OAuth client</th><th>Token store</th><th></th>
</tr></thead>
<tbody>{rows}</tbody></table>
<h2>Connect a new BOS connection</h2>
<form method="post" action="{escape(home)}connect">{_hidden_csrf(csrf)}
<label for="conn_id">Connection id</label><input id="conn_id" name="conn_id" value="bos_default" required>
<label for="resource_url">MCP resource URL</label>
<input id="resource_url" name="resource_url" placeholder="https://dfsm.ai/mcp/apps/bos/platform" required>
<label for="token_store_conn_id">Token store SQL connection (optional; needed when tasks run on several
hosts)</label><input id="token_store_conn_id" name="token_store_conn_id">
<p><button type="submit" data-action="connect-new">Connect</button></p></form>
<p class="muted">Connect signs you in to BOS in this browser; the grant goes to the token store and the
Connection keeps no secret. Tokens are never shown here. {escape(PERMISSION_NOTE)}</p>"""
    return _layout("BOS connections", body)


def contexts_page(conn_id: str, contexts: Sequence[BosContext], *, home: str) -> str:
    rows = "".join(
        f'<tr data-context="{escape(c.context_handle)}"><td>{escape(c.context_handle)}</td>'
        f"<td>{escape(c.organization_name or '-')}</td><td>{escape(c.application_name or '-')}</td>"
        f"<td>{escape(c.installation_name or '-')}</td><td>{escape(c.role_label or '-')}</td>"
        f"<td>{'default' if c.is_default else ''}</td></tr>"
        for c in contexts
    )
    body = f"""<h1>BOS connection {escape(conn_id)}: {len(contexts)} authorized context(s)</h1>
<div class="notice" role="status">Discovery and bos_get_context succeeded.</div>
<table><thead><tr><th>Context handle</th><th>Organization</th><th>Application</th><th>Installation</th>
<th>Role</th><th></th></tr></thead><tbody>{rows}</tbody></table>
<p><a href="{escape(home)}">Back to BOS connections</a></p>"""
    return _layout(f"BOS {conn_id}: contexts", body)


def message_page(title: str, message: str, *, home: str) -> str:
    body = (
        f'<h1>{escape(title)}</h1><div class="error" role="alert">{escape(message)}</div>'
        f'<p><a href="{escape(home)}">Back to BOS connections</a></p>'
    )
    return _layout(title, body)
