"""A notifier that records BOS completeness alerts as JSON lines (local development, tests, demos).

Production deployments pass any Airflow notifier instead (``SmtpNotifier``, ``SlackNotifier``...);
this one needs no external service. It writes only the verdict: never records or secrets.
"""

from __future__ import annotations

import json
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from airflow.sdk import BaseNotifier


class BosAlertFileNotifier(BaseNotifier):
    """Append one JSON line per alert to ``path`` and log it as a warning.

    :param path: file to append to (templated); parent folders are created.
    """

    template_fields = ("path",)

    def __init__(self, path: str) -> None:
        super().__init__()
        self.path = path

    def notify(self, context: Any) -> None:
        verdict = context.get("bos_verdict")
        ti = context.get("ti")
        alert = {
            "at": datetime.now(UTC).isoformat(),
            "dag_id": getattr(ti, "dag_id", None),
            "task_id": getattr(ti, "task_id", None),
            "outcome": getattr(verdict, "outcome", None),
            "message": getattr(verdict, "message", None),
            "run_id": (getattr(verdict, "run", None) or {}).get("run_id"),
            "failing_sources": [list(s) for s in getattr(verdict, "failing_sources", [])],
        }
        path = Path(self.path)
        path.parent.mkdir(parents=True, exist_ok=True)
        with path.open("a", encoding="utf-8") as fh:
            fh.write(json.dumps(alert) + "\n")
        self.log.warning("BOS alert: %s", alert["message"])
