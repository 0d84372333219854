"""Where a load's staged files live: a private directory per run, and the leftovers of dead runs removed.

Staged files hold every record of a run in clear (names, emails). Each load gets its own directory
``<base>/bos-stage/<pid>-<random>`` (mode 0700, in a root of mode 0700 owned by this user), with
``<base>`` the ``BOS_STAGE_DIR`` environment variable or else the system's temporary directory
(``TMPDIR``). A run holds an exclusive ``flock`` on the directory's lock file for as long as it
loads: the kernel releases it when the process ends, however it ends (SIGKILL, the OOM killer), so
the next load on the machine tells a dead run's directory from a live one by that lock (not by the
process id alone, which is reused) and removes it.
"""

from __future__ import annotations

import contextlib
import fcntl
import logging
import os
import shutil
import stat
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

from airflow_provider_bos.exceptions import BosConfigurationError

__all__ = ["STAGE_DIR_ENV", "remove_dead_runs", "run_stage_directory", "stage_root"]

log = logging.getLogger(__name__)

#: The environment variable naming the base directory of staged files (default: the temporary directory).
STAGE_DIR_ENV = "BOS_STAGE_DIR"
_ROOT_NAME = "bos-stage"
_LOCK_NAME = ".lock"
#: An unlocked directory of a process that still exists is a dead run's once it is this old (seconds).
UNLOCKED_GRACE_S = 600.0


def stage_root() -> Path:
    """``<base>/bos-stage``, created owner-only; refused if it is not a directory of this user's alone.

    :raises BosConfigurationError: the root is a symlink, not a directory, another user's, or open to others.
    """
    base = Path(os.environ.get(STAGE_DIR_ENV) or tempfile.gettempdir())
    base.mkdir(parents=True, exist_ok=True)
    root = base / _ROOT_NAME
    with contextlib.suppress(FileExistsError):
        root.mkdir(mode=0o700)
    info = os.lstat(root)
    if not stat.S_ISDIR(info.st_mode) or info.st_uid != os.geteuid() or stat.S_IMODE(info.st_mode) & 0o077:
        raise BosConfigurationError(
            f"The staging directory {root} must be a directory owned by this user (uid {os.geteuid()}) with "
            f"mode 0700; remove it, or point {STAGE_DIR_ENV} at a directory of this user's."
        )
    return root


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # exists, another user's
        return True
    return True


def _lock_held(lock: Path) -> bool:
    """Whether a process holds the lock file (False: no such file, or nobody holds it)."""
    try:
        fd = os.open(lock, os.O_RDONLY | os.O_NOFOLLOW)
    except FileNotFoundError:
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return True
    finally:
        os.close(fd)
    return False


def _owner_alive(run_dir: Path, now: float) -> bool:
    """Whether a live process may still load from ``run_dir``: it holds the lock; or nobody does but
    the process its name starts with exists and the directory is younger than
    :data:`UNLOCKED_GRACE_S` (a run between making its directory and locking it; past that, the id
    is another process's)."""
    if _lock_held(run_dir / _LOCK_NAME):
        return True
    pid = run_dir.name.partition("-")[0]
    if not pid.isdigit() or not _pid_alive(int(pid)):
        return False
    try:
        made = run_dir.lstat().st_mtime
    except FileNotFoundError:  # its run ended meanwhile and removed it: nothing left to remove
        return True
    return now - made < UNLOCKED_GRACE_S


def remove_dead_runs(root: Path) -> list[Path]:
    """Remove the directories of runs that ended without removing them; return them."""
    removed = []
    now = time.time()
    for run_dir in root.iterdir():
        if run_dir.is_symlink() or not run_dir.is_dir() or _owner_alive(run_dir, now):
            continue
        shutil.rmtree(run_dir, ignore_errors=True)
        removed.append(run_dir)
    if removed:
        log.warning("Removed %d staging director%s of BOS loads that were killed before they could remove them "
                    "(in %s).", len(removed), "y" if len(removed) == 1 else "ies", root)
    return removed


@contextlib.contextmanager
def run_stage_directory() -> Iterator[Path]:
    """A private directory for one load's files, removed with them when the load ends; dead runs'
    directories are removed first."""
    root = stage_root()
    remove_dead_runs(root)
    run_dir = Path(tempfile.mkdtemp(prefix=f"{os.getpid()}-", dir=root))  # mode 0700
    lock = os.open(run_dir / _LOCK_NAME, os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
    try:
        fcntl.flock(lock, fcntl.LOCK_EX)
        yield run_dir
    finally:
        try:
            shutil.rmtree(run_dir, ignore_errors=True)
        finally:
            os.close(lock)
