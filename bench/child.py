"""One measurement in its own process: ``python -m bench.child KIND RESULT_FILE`` with a JSON spec on stdin.

Writes a JSON object to RESULT_FILE: the measurement's figures plus ``peak_rss_mib`` (this
process's VmHWM at the end), or ``unavailable`` / ``error`` with a reason. The bearer token comes
in the environment (``BENCH_BEARER_TOKEN``), never on the command line.
"""

from __future__ import annotations

import json
import os
import sys
import traceback
from pathlib import Path
from typing import Any

from bench.rss import peak_rss_mib


def _run(kind: str, spec: dict[str, Any]) -> dict[str, Any]:
    if kind == "baseline":
        from bench.baselines import run_baseline
        from bench.data import ScenarioParams

        params = ScenarioParams(**spec["scenario"])
        return run_baseline(spec["dialect"], spec["kind"], spec["url"], spec["table"], params)
    if kind == "sync":
        from bench.ours import sync_once

        token = os.environ["BENCH_BEARER_TOKEN"]
        call = lambda: sync_once(spec["mcp_url"], token, spec["url"], table=spec["table"],  # noqa: E731
                                 audit_table=spec["audit_table"], style=spec["style"],
                                 stream=spec.get("stream", True))
        if spec.get("profile"):
            return _profiled(call, spec["profile"])
        return call()
    if kind == "prefill":
        from bench.ours import prefill_other

        return prefill_other(spec["url"], table=spec["table"], audit_table=spec["audit_table"],
                             scenario=spec["scenario"])
    if kind == "read":
        from bench.ours import read_once

        return read_once(spec["mcp_url"], os.environ["BENCH_BEARER_TOKEN"], style=spec["style"],
                         known=bool(spec.get("known")), hashed=bool(spec.get("hashed")))
    if kind == "drain":
        from bench.drain import drain_once

        result = drain_once(spec["mcp_url"], os.environ["BENCH_BEARER_TOKEN"], style=spec["style"])
        result["records"] = spec["records"]
        return result
    if kind == "sse-line":
        from bench.sse_bench import bench_data_line

        return bench_data_line(spec["megabytes"])
    if kind == "sse-notifications":
        from bench.sse_bench import bench_notifications

        return bench_notifications(spec["count"], spec["records_per_page"])
    raise SystemExit(f"unknown measurement kind {kind!r}")


def _profiled(call: Any, path: str) -> dict[str, Any]:
    """Run under cProfile; dump ``path``.pstats and the top functions as ``path``.txt (figures are inflated)."""
    import cProfile
    import io
    import pstats

    profiler = cProfile.Profile()
    result = profiler.runcall(call)
    profiler.dump_stats(path + ".pstats")
    out = io.StringIO()
    stats = pstats.Stats(profiler, stream=out).sort_stats("tottime")
    stats.print_stats(30)
    stats.sort_stats("cumulative").print_stats(30)
    Path(path + ".txt").write_text(out.getvalue(), encoding="utf-8")
    result["profile"] = path + ".txt"
    return result


def main() -> int:
    kind, result_file = sys.argv[1], Path(sys.argv[2])
    spec = json.loads(sys.stdin.read() or "{}")
    try:
        result = _run(kind, spec)
    except Exception as exc:
        from bench.ours import Unavailable

        if isinstance(exc, Unavailable):
            result = {"unavailable": str(exc)}
        else:
            traceback.print_exc()
            result = {"error": f"{type(exc).__name__}: {str(exc)[:300]}"}
    result["peak_rss_mib"] = peak_rss_mib()
    result_file.write_text(json.dumps(result, default=str), encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
