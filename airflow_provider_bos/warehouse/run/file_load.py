"""The staged-file load (DuckDB): rows written as newline-delimited JSON, loaded by ``read_json``.

A :class:`~.loads.Loader` for databases whose fast path is a file, not a statement per row.
Each record becomes one JSON line keyed by the staging columns (:data:`~.dialects.STAGE_COLUMNS`),
assembled from the canonical JSON the encoders already made (no second serialisation, no
escaping: JSON text is its own quoting). Every :data:`FILE_BLOCK_ROWS` lines the file is loaded
into the run's staging table (the dialect's ``load_file``), so the files and this process's memory
stay bounded whatever the result's size. The files hold the records in clear: they live in a
private directory of the run (:mod:`.stage_dir`: ``<BOS_STAGE_DIR or TMPDIR>/bos-stage/<pid>-<random>``,
mode 0700), removed when the load ends; a run killed before it could remove it (SIGKILL, the OOM
killer) has it removed by the next load on the machine.

The database runs in this process: a block is loaded by a thread of its own (:class:`_Loader`)
while the next block is written to a second file, so the read's Python work and the database's
load (which releases the GIL) overlap on two cores instead of taking turns. Loads run one at a
time, in order, and the caller's thread does not use the connection until they are all done.

Known records: a claim kept out of staging (``kept``) writes nothing; any other claim is a line
of its key, wire hash and position only (a known row, see :data:`~.dialects.STAGE_COLUMNS`).
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor, wait
from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

import orjson

from airflow_provider_bos.warehouse.run.loads import SeenKeys, encoded
from airflow_provider_bos.warehouse.run.stage_dir import run_stage_directory
from airflow_provider_bos.warehouse.tables.records import column_values

if TYPE_CHECKING:
    from airflow_provider_bos.warehouse.dialects.duckdb import DuckDbDialect
    from airflow_provider_bos.warehouse.dialects.statement import Statement
    from airflow_provider_bos.warehouse.run.claims import KeptClaims
    from airflow_provider_bos.warehouse.run.rejects import Rejects
    from airflow_provider_bos.warehouse.run.transaction import RunTransaction

__all__ = ["FILE_BLOCK_ROWS", "FILE_LOADER", "FileLoad"]

#: Lines per load of the staged file (~65 MB of file at ~1.3 KB per record; read_json parses it
#: in parallel, so fewer, larger blocks are cheaper: see bench/README.md "DuckDB").
FILE_BLOCK_ROWS = 50_000
# Lines are written to the file in chunks of this many (one write call each).
_WRITE_ROWS = 2_000

_KEYS = tuple(
    b'"%s":' % name.encode("ascii")
    for name in ("record_ref", "display_name", "email", "phone", "lifecycle", "identity_match", "attributes",
                 "sources", "_bos_observed_at", "_bos_record_hash", "_bos_wire_hash", "_bos_seq")
)


def _line(parts: tuple[bytes, ...], observed: bytes, record_hash: str, wire_hash: str | None, seq: int) -> bytes:
    """One staged row as a JSON line; ``parts`` are the content columns as canonical JSON."""
    k = _KEYS
    wire = b"null" if wire_hash is None else b'"%b"' % wire_hash.encode("ascii")
    return b"".join((
        b"{", k[0], parts[0], b",", k[1], parts[1], b",", k[2], parts[2], b",", k[3], parts[3], b",",
        k[4], parts[4], b",", k[5], parts[5], b",", k[6], parts[6], b",", k[7], parts[7], b",",
        k[8], observed, b",", k[9], b'"%b"' % record_hash.encode("ascii"), b",", k[10], wire, b",",
        k[11], b"%d}\n" % seq,
    ))


def _known_line(record_ref: str, wire_hash: str, seq: int, stamp: bytes | None) -> bytes:
    """A claim's line: its key, its own stamp (``stamp``, JSON; None: the stored row's), wire hash, position."""
    k = _KEYS
    observed = b"" if stamp is None else b"".join((k[8], stamp, b","))
    return b"".join((b"{", k[0], orjson.dumps(record_ref), b",", observed, k[10],
                     b'"%b"' % wire_hash.encode("ascii"), b",", k[11], b"%d}\n" % seq))


def _json_stamp(stamps: dict[datetime, bytes], observed: datetime) -> bytes:
    """``observed`` as a JSON string, remembered in ``stamps`` (a result shares a few thousand at most)."""
    stamp = stamps.get(observed)
    if stamp is None:
        stamp = b'"%b"' % observed.isoformat().encode("ascii")
        if len(stamps) < 4096:
            stamps[observed] = stamp
    return stamp


def _keyed_lines(
    records: Iterable[Any], default_obs: datetime | None, kept: KeptClaims | None, rejects: Rejects | None,
) -> Iterator[tuple[str, bytes, bool]]:
    """``(record_ref, line, known)`` of every record to stage (for :meth:`SeenKeys.watch`); ``known``:
    the line is a claim's (key, wire hash and position only)."""
    keep = kept.keep if kept is not None else None
    stamps: dict[datetime, bytes] = {}  # a result shares a few thousand observation times at most
    for seq, record, values in encoded(records, column_values, default_obs, rejects):
        if values is None:
            if keep is None or not keep(record, seq):
                observed = record.observed_at
                stamp = None if observed is None else _json_stamp(stamps, observed)
                yield record.record_ref, _known_line(record.record_ref, record.wire_hash, seq, stamp), True
            continue
        ref, parts, observed, record_hash, _ = values
        stamp = _json_stamp(stamps, observed)
        yield ref, _line(parts, stamp, record_hash, getattr(record, "wire_hash", None), seq), False


class _Loader:
    """Runs a load's statements on the run's connection in one thread of its own, in order.

    The caller hands statements over with :meth:`submit` and goes on; :meth:`drain` waits for all of
    them and raises the first failure. Leaving the ``with`` block waits for a load still running
    and drops those not started (the caller may roll back only when the connection is idle again).
    """

    def __init__(self, tx: RunTransaction) -> None:
        self._tx = tx
        self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="bos-file-load")
        self._submitted: list[Future[Any]] = []

    def __enter__(self) -> _Loader:
        return self

    def __exit__(self, *exc: object) -> None:
        self._pool.shutdown(wait=True, cancel_futures=True)

    def submit(self, statement: Statement) -> Future[Any]:
        future = self._pool.submit(self._tx.exec, statement)
        self._submitted.append(future)
        return future

    def drain(self) -> None:
        for future in self._submitted:
            future.result()
        self._submitted.clear()


class _BlockFile:
    """Two temporary NDJSON files taking turns: every :data:`FILE_BLOCK_ROWS` lines (and at
    :meth:`flush`) the file written so far is handed to the :class:`_Loader` as
    ``load(path, longest_line)`` and the lines go on into the other one, emptied once its own load
    is done; made in ``directory`` (the run's own), removed when the ``with`` block ends."""

    def __init__(self, loader: _Loader, load: Callable[[str, int], Statement], directory: Path, name: str) -> None:
        self._loader, self._load = loader, load
        self.paths: list[str] = []
        self._files = []
        for i in range(2):
            path = str(directory / f"bos-stage-{name}-{i}.ndjson")
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
            self.paths.append(path)
            self._files.append(os.fdopen(fd, "wb"))
        self._loads: list[Future[Any] | None] = [None, None]  # each file's load in flight
        self._current = 0
        self._chunk: list[bytes] = []
        self._pending = 0  # lines written to the current file, not handed over yet
        self._longest = 0  # bytes of the current file's longest line
        self.loaded = 0  # lines handed over to be loaded

    def __enter__(self) -> _BlockFile:
        return self

    def __exit__(self, *exc: object) -> None:
        try:
            # A file is removed only when no load reads it (after a failure, one not started is dropped).
            pending = [f for f in self._loads if f is not None and not f.cancel()]
            wait(pending)
            for out in self._files:
                out.close()
        finally:
            for path in self.paths:
                os.unlink(path)

    def add(self, line: bytes) -> None:
        chunk = self._chunk
        chunk.append(line)
        if len(chunk) >= _WRITE_ROWS or self._pending + len(chunk) >= FILE_BLOCK_ROWS:
            self._write()
            if self._pending >= FILE_BLOCK_ROWS:
                self.flush()

    def _write(self) -> None:
        self._longest = max(self._longest, *map(len, self._chunk))
        self._files[self._current].write(b"".join(self._chunk))
        self._pending += len(self._chunk)
        self._chunk.clear()

    def flush(self) -> None:
        """Hand every line added so far to the loader; the next lines go to the other file."""
        if self._chunk:
            self._write()
        if not self._pending:
            return
        current = self._current
        self._files[current].flush()
        self._loads[current] = self._loader.submit(self._load(self.paths[current], self._longest))
        self.loaded += self._pending
        self._pending = self._longest = 0
        self._current = other = 1 - current
        # The other file's last load must be done before it is emptied and written again.
        previous = self._loads[other]
        if previous is not None:
            previous.result()
            self._loads[other] = None
        self._files[other].seek(0)
        self._files[other].truncate()


def _into_stage(tx: RunTransaction) -> Callable[[str, int], Statement]:
    """``load(path, longest_line)`` of a block file into the run's staging table."""
    d = cast("DuckDbDialect", tx.dialect)  # the dialects of this loader load files
    return lambda path, longest_line: d.load_file(tx.stage, tx.schema, path, longest_line=longest_line)


class FileLoad:
    """Staging through a newline-delimited JSON file, or the same file loaded into an empty table."""

    name = "staged_file"
    keeps_claims = True

    def stage(
        self, tx: RunTransaction, records: Iterable[Any], default_obs: datetime | None, *, batch_size: int,
        seen: SeenKeys, kept: KeptClaims | None, rejects: Rejects | None,
    ) -> int:
        with (run_stage_directory() as directory, _Loader(tx) as loader,
              _BlockFile(loader, _into_stage(tx), directory, "stage") as stage):
            for row in seen.watch(_keyed_lines(records, default_obs, kept, rejects)):
                assert row is not None  # watch yields None only with ``divert``
                stage.add(row[1])
            stage.flush()
            loader.drain()
            return stage.loaded

    def load_direct(
        self, tx: RunTransaction, records: Iterable[Any], default_obs: datetime | None, synced_at: datetime, *,
        batch_size: int, rejects: Rejects | None,
    ) -> tuple[int, int]:
        """Load the records into the (empty, locked) target through the staged file; return (loaded,
        staged).

        As :meth:`~.loads.CopyLoader.load_direct`: a record whose record_ref may already have been loaded (a
        repeat, or a false positive of :class:`SeenKeys`) goes to a second file loaded into staging,
        to be merged after the last record (:mod:`.settle`).
        """
        d = cast("DuckDbDialect", tx.dialect)

        def into_target(path: str, longest_line: int) -> Statement:
            return d.load_file_target(tx.table, tx.schema, path, longest_line=longest_line, synced_at=synced_at,
                                      run_id=tx.run_id)

        with (run_stage_directory() as directory, _Loader(tx) as loader,
              _BlockFile(loader, into_target, directory, "target") as target,
              _BlockFile(loader, _into_stage(tx), directory, "stage") as stage):
            repeats: list[tuple[str, bytes, bool]] = []
            for row in SeenKeys().watch(_keyed_lines(records, default_obs, None, rejects), divert=repeats,
                                        divert_limit=_WRITE_ROWS):
                if row is None:  # the possible repeats: to the staging file
                    self._stage_repeats(tx, stage, repeats)
                elif row[2]:  # a claim on a stored row of an empty table
                    raise tx.unverified(1)
                else:
                    target.add(row[1])
            target.flush()
            self._stage_repeats(tx, stage, repeats)
            stage.flush()
            loader.drain()
            return target.loaded, stage.loaded

    @staticmethod
    def _stage_repeats(tx: RunTransaction, stage: _BlockFile, repeats: list[tuple[str, bytes, bool]]) -> None:
        for _, line, known in repeats:
            if known:
                raise tx.unverified(1)
            stage.add(line)
        repeats.clear()


FILE_LOADER = FileLoad()
