"""Subprocesses of a bench run: the reference server, and one child per measurement.

Each measurement runs in its own interpreter so its peak RSS is its own; the server runs in yet
another so its CPU and memory are never counted against the client.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import httpx

__all__ = ["ChildFailed", "ReferenceServerProcess", "ReplayProcess", "run_child"]

_ROOT = Path(__file__).resolve().parent.parent


def _child_env(extra: dict[str, str] | None = None) -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = str(_ROOT) + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    env.setdefault("PYTHONHASHSEED", "0")
    if extra:
        env.update(extra)
    return env


def _stop(proc: subprocess.Popen[Any], grace_s: float = 10.0) -> None:
    if proc.poll() is not None:
        return
    try:
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=grace_s)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(timeout=grace_s)
    except ProcessLookupError:
        pass


class _LoopbackService:
    """A loopback HTTP service in a subprocess of its own session, that prints ``<marker><url>`` at start.

    Its own session: a Ctrl-C in the terminal reaches the bench, which then stops the service
    (``stop`` in a ``finally``) instead of both racing to exit.
    """

    marker = ""
    health_path = ""

    def __init__(self, argv: list[str], log_file: Path, *, startup_timeout_s: float = 60.0) -> None:
        self.argv = argv
        self.log_file = log_file
        self.startup_timeout_s = startup_timeout_s
        self.proc: subprocess.Popen[bytes] | None = None
        self.url = ""
        self.base_url = ""

    def start(self) -> None:
        out = open(self.log_file, "wb")  # noqa: SIM115 - the child holds its own handle
        try:
            self.proc = subprocess.Popen([sys.executable, *self.argv], stdout=out, stderr=subprocess.STDOUT,
                                         stdin=subprocess.DEVNULL, env=_child_env(), start_new_session=True)
        finally:
            out.close()
        deadline = time.monotonic() + self.startup_timeout_s
        while time.monotonic() < deadline:
            text = self.log_file.read_text(encoding="utf-8", errors="replace")
            for line in text.splitlines():
                if self.marker in line:
                    self.url = line.split(self.marker, 1)[1].strip()
                    self.base_url = "{0.scheme}://{0.netloc}".format(urlsplit(self.url))
            if self.url and self._answers():
                return
            if self.proc.poll() is not None:
                raise RuntimeError(f"{self.argv[1]} exited with {self.proc.returncode}:\n{text[-2000:]}")
            time.sleep(0.1)
        self.stop()
        raise RuntimeError(f"{self.argv[1]} did not start within {self.startup_timeout_s}s")

    def _answers(self) -> bool:
        try:
            return httpx.get(self.base_url + self.health_path, timeout=2).status_code == 200
        except httpx.HTTPError:
            return False

    def stop(self) -> None:
        if self.proc is not None:
            _stop(self.proc)


class ReferenceServerProcess(_LoopbackService):
    """``python -m airflow_provider_bos.testing.server`` on a free loopback port."""

    marker = "MCP URL "
    health_path = "/_bos/admin/counters"

    def __init__(self, scenario_json: str, workdir: Path) -> None:
        scenario_file = workdir / "scenario.json"
        scenario_file.write_text(scenario_json, encoding="utf-8")
        super().__init__(["-m", "airflow_provider_bos.testing.server", "--host", "127.0.0.1", "--port", "0",
                          "--scenario", str(scenario_file), "--access-token-ttl", "86400"], workdir / "server.log")

    @property
    def mcp_url(self) -> str:
        return self.url

    def set_day(self, day: int) -> None:
        """Serve ``day`` of the scenario from now on (admin route; loopback test server only)."""
        response = httpx.post(f"{self.base_url}/_bos/admin/day", json={"day": day}, timeout=60)
        if response.status_code != 200:
            raise RuntimeError(f"day switch failed: HTTP {response.status_code} {response.text[:200]}")

    def set_scenario(self, scenario_json: str) -> None:
        """Switch the server's scenario (admin route; loopback test server only)."""
        response = httpx.post(f"{self.base_url}/_bos/admin/scenario", content=scenario_json,
                              headers={"Content-Type": "application/json"}, timeout=60)
        if response.status_code != 200:
            raise RuntimeError(f"scenario switch failed: HTTP {response.status_code} {response.text[:200]}")


class ReplayProcess(_LoopbackService):
    """``python -m bench.replay`` in front of the reference server (see bench/replay.py)."""

    marker = "REPLAY URL "
    health_path = "/_bench/stats"

    def __init__(self, upstream_mcp_url: str, workdir: Path, name: str = "replay") -> None:
        cache = workdir / f"{name}-cache"
        super().__init__(["-m", "bench.replay", "--upstream", upstream_mcp_url, "--cache-dir", str(cache)],
                         workdir / f"{name}.log")

    def reset(self) -> None:
        httpx.post(f"{self.base_url}/_bench/reset", timeout=60).raise_for_status()

    def stats(self) -> dict[str, int]:
        return httpx.get(f"{self.base_url}/_bench/stats", timeout=10).json()


class ChildFailed(RuntimeError):
    """A measurement child crashed or timed out; ``detail`` holds the tail of its output."""

    def __init__(self, message: str, detail: str = "") -> None:
        super().__init__(message)
        self.detail = detail


_current: subprocess.Popen[bytes] | None = None


def run_child(
    kind: str, spec: dict[str, Any], *, timeout_s: float, env: dict[str, str] | None = None
) -> dict[str, Any]:
    """Run ``python -m bench.child kind`` with ``spec`` on stdin; return the dict it reports."""
    global _current  # noqa: PLW0603 - the child in flight, for the signal handler to end
    with tempfile.TemporaryDirectory(prefix="bos-bench-child-") as tmp:
        result_file = Path(tmp) / "result.json"
        log_file = Path(tmp) / "child.log"
        with open(log_file, "wb") as log:
            proc = subprocess.Popen(
                [sys.executable, "-m", "bench.child", kind, str(result_file)],
                stdin=subprocess.PIPE, stdout=log, stderr=subprocess.STDOUT, env=_child_env(env),
            )
            _current = proc
            try:
                assert proc.stdin is not None
                proc.stdin.write(json.dumps(spec).encode())
                proc.stdin.close()
                proc.wait(timeout=timeout_s)
            except subprocess.TimeoutExpired:
                _stop(proc, grace_s=5)
                raise ChildFailed(f"{kind} did not finish within {timeout_s:.0f}s",
                                  log_file.read_text(errors="replace")[-3000:]) from None
            finally:
                _stop(proc, grace_s=5)  # no-op unless interrupted (Ctrl-C) while waiting
                _current = None
        if proc.returncode != 0 or not result_file.exists():
            raise ChildFailed(f"{kind} exited with status {proc.returncode}",
                              log_file.read_text(errors="replace")[-3000:])
        return json.loads(result_file.read_text(encoding="utf-8"))
