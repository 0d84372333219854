"""The client the official MCP conformance suite runs: ``McpSession`` against the suite's test servers.

    python -m airflow_provider_bos.testing.conformance_client <server-url>

The suite (npm ``@modelcontextprotocol/conformance``, driven by ``.ci/conformance``) starts one
test server per client scenario, runs this command with the server's URL appended and judges
what it saw on the wire. We connect in the 2025-11-25 era (``initialize``), list the tools and
call each tool a scenario's server offers, with the arguments its source expects; a tool we do
not know is not called (``initialize`` has none). Exit 0 when every call answered a result, 1 on
a :class:`~airflow_provider_bos.exceptions.BosError` (printed, with its type) or a tool error.

No Airflow here: only :mod:`airflow_provider_bos.mcp` and httpx.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
from collections.abc import Mapping, Sequence
from typing import Any

from airflow_provider_bos.exceptions import BosError
from airflow_provider_bos.mcp import McpSession
from airflow_provider_bos.models import PROTOCOL_2025

__all__ = ["SCENARIO_TOOL_CALLS", "main", "run"]

#: The tools the suite's client scenarios (0.1.x) offer, and the arguments each expects.
SCENARIO_TOOL_CALLS: Mapping[str, Mapping[str, Any]] = {
    "add_numbers": {"a": 2, "b": 3},  # tools_call: the server checks it was called
    "test_reconnection": {},  # sse-retry: the server closes the stream; the result comes on the resumed GET
    "test_client_elicitation_defaults": {},  # elicitation-sep1034-client-defaults: asks elicitation/create
    "json_schema_echo": {},  # json-schema-2020-12-preservation (suite 0.2): gets the schema we were listed
}

logger = logging.getLogger("bos.conformance")


def run(url: str, *, timeout: float = 10.0) -> int:
    """Connect, list tools, call the known ones; the process exit code."""
    scenario = os.environ.get("MCP_CONFORMANCE_SCENARIO", "?")
    try:
        session = McpSession(url, era=PROTOCOL_2025, timeout=timeout, client_name="bos-conformance-client")
        with session:
            session.connect()
            logger.info("scenario %s: connected, protocol %s, server %s", scenario, session.protocol_version,
                        session.server_info)
            tools = session.list_tools()
            names = [tool.get("name") for tool in tools]
            logger.info("tools/list: %s", names)
            failed = False
            for name in names:
                if not isinstance(name, str) or name not in SCENARIO_TOOL_CALLS:
                    continue
                arguments = dict(SCENARIO_TOOL_CALLS[name])
                if name == "json_schema_echo":  # round-trip the schema exactly as tools/list gave it to us
                    arguments["schema"] = next((t.get("inputSchema") for t in tools
                                                if t.get("name") == "json_schema_2020_12_tool"), None)
                result = session.call_tool(name, arguments)
                logger.info("tools/call %s -> %s", name, _texts(result))
                if result.get("isError"):
                    failed = True
    except BosError as exc:
        print(f"{type(exc).__name__}: {exc}", file=sys.stderr)
        return 1
    return 1 if failed else 0


def _texts(result: Mapping[str, Any]) -> list[str]:
    content = result.get("content")
    if not isinstance(content, list):
        return []
    return [str(part.get("text")) for part in content
            if isinstance(part, Mapping) and part.get("type") == "text"]


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m airflow_provider_bos.testing.conformance_client",
                                     description="McpSession as a client for the MCP conformance suite.")
    parser.add_argument("url", help="the MCP endpoint of the scenario's test server (the suite appends it)")
    parser.add_argument("--timeout", type=float, default=10.0, help="HTTP timeout in seconds (default 10)")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, stream=sys.stderr, format="%(levelname)s %(name)s: %(message)s")
    return run(args.url, timeout=args.timeout)


if __name__ == "__main__":
    sys.exit(main())
