"""How a sync task's failure reads in its log: one ERROR line saying what failed and what to do, last
before Airflow's traceback (which ends with the same message), the chain of causes at debug level."""

from __future__ import annotations

import logging
import traceback
from typing import Any

from airflow_provider_bos.exceptions import BosError, one_line

__all__ = ["reported"]


def _quotes_its_database_error(exc: BaseException) -> bool:
    """Whether ``exc`` is raised from a database error, whose driver message it quotes (``db_detail``):
    the cause's traceback then adds only SQLAlchemy's frames and the statement."""
    import sqlalchemy as sa

    return isinstance(exc.__cause__, sa.exc.DBAPIError)


def reported(exc: BosError, log: logging.Logger | Any) -> BosError:
    """Log ``exc`` for the task's reader and return it to raise.

    The chain of causes goes to the debug level; the one ERROR line is the last thing logged. An
    error whose cause is a database error it already quotes is returned without that chain, so
    the traceback Airflow prints is the error's own frames, not SQLAlchemy's and the driver's.
    """
    if log.isEnabledFor(logging.DEBUG):  # formatted now: the chain may be trimmed below
        log.debug("BOS task failed; the chain of causes, for debugging:\n%s",
                  "".join(traceback.format_exception(exc)).rstrip())
    if _quotes_its_database_error(exc):
        exc.__cause__ = None
        exc.__suppress_context__ = True
    log.error("BOS task failed: %s", one_line(exc))
    return exc
