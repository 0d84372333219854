"""DuckDB's staged files: in a private directory of the run, and a killed run's files removed by the next load."""

from __future__ import annotations

import os
import signal
import stat
import subprocess
import sys
from pathlib import Path

import pytest
import sqlalchemy as sa
from whhelpers import make_record, write

from airflow_provider_bos.exceptions import BosConfigurationError
from airflow_provider_bos.warehouse import WarehouseWriter
from airflow_provider_bos.warehouse.run import file_load

pytest.importorskip("duckdb_engine")

# A DuckDB load that stages its first block of records, says so, and then waits for a line that never
# comes (until it is killed). argv: the database file.
KILLED_LOAD = """
import sys
sys.path.insert(0, {helpers!r})
import sqlalchemy as sa
from whhelpers import make_record, write
from airflow_provider_bos.exceptions import BosConfigurationError
from airflow_provider_bos.warehouse import WarehouseWriter
from airflow_provider_bos.warehouse.run import file_load

file_load.FILE_BLOCK_ROWS = 10

def records():
    for i in range(15):
        yield make_record(i)
    print("staged", flush=True)
    sys.stdin.readline()

writer = WarehouseWriter(sa.create_engine("duckdb:///" + sys.argv[1]), table="people", audit_table="people_runs")
write(writer, records())
"""


def staged_emails(base: Path) -> list[str]:
    """Files under ``base`` holding a staged email of the killed load."""
    return [str(p) for p in base.rglob("*") if p.is_file() and b"p3@example.com" in p.read_bytes()]




def kill_a_load_midway(db: Path) -> None:
    helpers = str(Path(__file__).parent)
    proc = subprocess.Popen([sys.executable, "-c", KILLED_LOAD.format(helpers=helpers), str(db)],
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=os.environ.copy())
    try:
        assert proc.stdout.readline().strip() == "staged"
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait()
        proc.stdin.close()
        proc.stdout.close()
    assert proc.returncode == -signal.SIGKILL


def test_the_next_load_removes_what_a_killed_load_staged(stage_base: Path, tmp_path: Path) -> None:
    kill_a_load_midway(tmp_path / "killed.duckdb")
    left = staged_emails(stage_base)
    assert left  # SIGKILL runs no cleanup: the killed run's block file is still there

    engine = sa.create_engine(f"duckdb:///{tmp_path / 'next.duckdb'}")
    write(WarehouseWriter(engine, table="people", audit_table="people_runs"), [make_record(1000)])
    engine.dispose()
    assert staged_emails(stage_base) == []
    assert all(Path(p).parent.parent == stage_base / "bos-stage" for p in left), left  # it was in a run directory
    assert list((stage_base / "bos-stage").iterdir()) == []  # and the directories are gone too


def test_a_live_load_keeps_its_directory_private(stage_base: Path, tmp_path: Path, monkeypatch) -> None:
    """Owner-only directories; another live run's directory is left alone by a load that starts."""
    monkeypatch.setattr(file_load, "FILE_BLOCK_ROWS", 10)
    seen: list[tuple[Path, int, int]] = []
    other = stage_base / "bos-stage" / f"{os.getppid()}-live"  # a live process's run (this test's parent)
    engine = sa.create_engine(f"duckdb:///{tmp_path / 'w.duckdb'}")

    def records():
        for i in range(15):
            yield make_record(i)
        run_dirs = [d for d in (stage_base / "bos-stage").iterdir() if d != other]
        assert len(run_dirs) == 1
        root = stage_base / "bos-stage"
        seen.append((run_dirs[0], stat.S_IMODE(root.stat().st_mode), stat.S_IMODE(run_dirs[0].stat().st_mode)))

    (stage_base / "bos-stage").mkdir(mode=0o700)
    other.mkdir(mode=0o700)
    (other / "bos-stage-x.ndjson").write_bytes(b"{}\n")
    write(WarehouseWriter(engine, table="people", audit_table="people_runs"), records())
    engine.dispose()
    [(run_dir, root_mode, run_mode)] = seen
    assert run_dir.name.startswith(f"{os.getpid()}-")
    assert (root_mode, run_mode) == (0o700, 0o700)
    assert not run_dir.exists() and other.exists()


def test_stage_dir_setting_moves_staging(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """BOS_STAGE_DIR puts the stage directories elsewhere (e.g. an encrypted volume)."""
    base = tmp_path / "stage-volume"
    monkeypatch.setenv("BOS_STAGE_DIR", str(base))
    found: list[Path] = []
    engine = sa.create_engine(f"duckdb:///{tmp_path / 'w.duckdb'}")

    def records():
        yield make_record(1)
        found.extend(base.glob("bos-stage/*/*.ndjson"))

    write(WarehouseWriter(engine, table="people", audit_table="people_runs"), records())
    engine.dispose()
    assert found and list((base / "bos-stage").iterdir()) == []


def test_a_stage_root_open_to_others_is_refused(stage_base: Path, tmp_path: Path) -> None:
    """Another user could read or swap what is staged there: the load refuses and says what to do."""
    root = stage_base / "bos-stage"
    root.mkdir()
    root.chmod(0o777)
    engine = sa.create_engine(f"duckdb:///{tmp_path / 'w.duckdb'}")
    with pytest.raises(BosConfigurationError, match=r"mode 0700.*BOS_STAGE_DIR"):
        write(WarehouseWriter(engine, table="people", audit_table="people_runs"), [make_record(1)])
    engine.dispose()
    assert list(root.iterdir()) == []


def test_a_directory_its_run_removes_while_another_load_looks_at_it_is_left_alone(tmp_path, monkeypatch) -> None:
    """Two loads on one machine: the one cleaning up lists a live run's directory, and that run ends
    (removing it and its lock) before the look at it. Nothing to remove, and no error."""
    from airflow_provider_bos.warehouse.run import stage_dir

    run_dir = tmp_path / f"{os.getpid()}-finishing"  # a live process's id, no lock held
    run_dir.mkdir()

    def its_run_ends(lock: Path) -> bool:
        run_dir.rmdir()
        return False

    monkeypatch.setattr(stage_dir, "_lock_held", its_run_ends)
    assert stage_dir.remove_dead_runs(tmp_path) == []
