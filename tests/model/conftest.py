"""Fixtures of the model tests: the Hypothesis profiles, and what is observed besides the tables (log
lines, staged files)."""

from __future__ import annotations

import logging
import os
from pathlib import Path

import pytest
from hypothesis import HealthCheck, settings

from tests.model.machine import Observed

# derandomize: the same examples on every run (CI is reproducible); no example database is written.
_COMMON = {"deadline": None, "derandomize": True, "database": None, "print_blob": False,
           "suppress_health_check": [HealthCheck.too_slow, HealthCheck.filter_too_much,
                                     HealthCheck.function_scoped_fixture]}
settings.register_profile("bos-model", max_examples=15, stateful_step_count=8, **_COMMON)
settings.register_profile("bos-model-full", max_examples=8, stateful_step_count=8, **_COMMON)


@pytest.fixture()
def observed(caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch, stage_base: Path) -> Observed:
    """Every log line of the provider (DEBUG and up), and the text of every staged file as it is
    removed (read just before its unlink)."""
    caplog.set_level(logging.DEBUG, logger="airflow_provider_bos")
    seen = Observed(logs=lambda: [r.getMessage() + (r.exc_text or "") for r in caplog.records],
                    stage_base=stage_base)
    stage = str(stage_base / "bos-stage")
    unlink = os.unlink

    def reading_unlink(path: str | os.PathLike[str], *, dir_fd: int | None = None) -> None:
        where = os.path.join(os.readlink(f"/proc/self/fd/{dir_fd}"), os.fspath(path)) if dir_fd is not None \
            else os.path.abspath(os.fspath(path))
        if where.startswith(stage):
            try:
                fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW, dir_fd=dir_fd)
                with os.fdopen(fd, "rb") as staged:
                    seen.staged.append(staged.read().decode("utf-8", "replace"))
            except OSError:
                pass
        unlink(path, dir_fd=dir_fd)

    monkeypatch.setattr(os, "unlink", reading_unlink)
    return seen
