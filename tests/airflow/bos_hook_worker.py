"""One worker of the concurrency test: full federated reads through BosHook in a loop.

Usage: python bos_hook_worker.py <conn id> <ready file> <stop file>

Each iteration is what one task does: a new BosHook (discovery, token from the shared store,
session), one federated read, every final record consumed, the hook closed. Runs until the stop
file exists, then prints one JSON line: {"reads": n, "records": n, "errors": [...]}.
"""

from __future__ import annotations

import json
import sys
import traceback
from pathlib import Path


def main(argv: list[str]) -> int:
    conn_id, ready_file, stop_file = argv
    from airflow_provider_bos.hooks.bos import BosHook

    stop = Path(stop_file)
    Path(ready_file).touch()
    reads, records, errors = 0, 0, []
    while not stop.exists():
        try:
            with BosHook(conn_id) as hook:
                result = hook.federated_read("people.search", {"query": "concurrency"})
                count = sum(1 for _ in result.records)
            if result.completeness != "complete" or count != result.result_count:
                errors.append(f"read {reads}: completeness {result.completeness}, {count} records")
            reads += 1
            records += count
        except Exception as exc:  # noqa: BLE001 - reported to the test, which fails on any
            errors.append(f"read {reads}: {type(exc).__name__}: {exc}\n{traceback.format_exc()[-1500:]}")
            reads += 1
            if len(errors) >= 5:
                break
    print(json.dumps({"reads": reads, "records": records, "errors": errors}), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
