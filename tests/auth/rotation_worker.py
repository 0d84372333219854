"""One worker process of the rotation concurrency test (run as a script, not collected).

Does authorized MCP requests (initialize + DELETE of the session) through an OAuthGrantAuth on the
shared token store until the grant's generation reaches the target or the deadline passes, then
prints a JSON summary on stdout.
"""

from __future__ import annotations

import json
import sys
import time

import httpx

from airflow_provider_bos.auth.grants import OAuthGrantAuth
from airflow_provider_bos.auth.token_store import SqlTokenStore

INIT = {
    "jsonrpc": "2.0",
    "id": 1,
    "method": "initialize",
    "params": {
        "protocolVersion": "2025-11-25",
        "capabilities": {},
        "clientInfo": {"name": "w", "version": "1"},
    },
}


def main() -> int:
    config = json.loads(sys.argv[1])
    store = SqlTokenStore(config["store_url"], table=config["table"])
    auth = OAuthGrantAuth(
        store,
        config["key"],
        token_endpoint=config["token_endpoint"],
        client_id=config["client_id"],
        resource=config["mcp_url"],
        refresh_margin_s=config["margin"],
        seed_refresh_token=config["seed_refresh_token"],
    )
    summary = {"requests": 0, "ok": 0, "failures": [], "refreshes": 0}
    deadline = time.monotonic() + config["max_seconds"]
    headers = {"Accept": "application/json, text/event-stream"}
    try:
        with httpx.Client(auth=auth, headers=headers, timeout=30) as client:
            while time.monotonic() < deadline:
                row = store.load(config["key"])
                if row is not None and row.generation > config["target_refreshes"]:
                    break
                summary["requests"] += 1
                try:
                    response = client.post(config["mcp_url"], json=INIT)
                    session = response.headers.get("mcp-session-id")
                    if response.status_code == 200 and session:
                        end = client.delete(
                            config["mcp_url"],
                            headers={"Mcp-Session-Id": session, "MCP-Protocol-Version": "2025-11-25"},
                        )
                        if end.status_code < 300:
                            summary["ok"] += 1
                            continue
                        response = end
                    summary["failures"].append(f"HTTP {response.status_code}")
                except Exception as exc:  # noqa: BLE001 - reported to the parent test
                    summary["failures"].append(f"{type(exc).__name__}: {exc}")
    finally:
        summary["refreshes"] = auth.refresh_count
        auth.close()
        store.dispose()
    print(json.dumps(summary))
    return 0


if __name__ == "__main__":
    sys.exit(main())
