"""A load's two halves on two threads: records pulled and encoded on a producer, written by the caller.

On two cores the client's reading and encoding (CPU in Python) and the database's COPY or batch
inserts can run at the same time: the driver releases the GIL while it waits on the socket. The
producer thread is the ONLY one that pulls the source (the records iterator reads an HTTP
response, which is not thread-safe); it hands over lists of up to ``batch`` items, at most
``depth`` lists ahead of the writer, so memory stays bounded whatever the result's size.

Failure rules (the writer's transaction must stay all-or-nothing):

- an exception raised by the source (the stream cut, a restarted frame, a refused record) is
  re-raised in the calling thread as the SAME object, after the last list the producer handed over
  before it and after the producer has stopped;
- if the calling thread stops early (a COPY error, a cancel), the producer stops before pulling
  another item, and :meth:`Pipeline.close` joins it: no thread outlives the load;
- nothing is kept between loads: a load started again after a failure builds a new pipeline.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import deque
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import Generic, TypeVar

__all__ = ["Pipeline", "PipelineStats"]

log = logging.getLogger(__name__)

T = TypeVar("T")


@dataclass
class PipelineStats:
    """Where one load's time went, per thread (``time.thread_time``: CPU of that thread alone)."""

    producer_cpu_s: float = 0.0
    writer_cpu_s: float = 0.0
    #: Wall time the writer waited for the producer (the read and encoding were the bottleneck).
    writer_starved_s: float = 0.0
    #: Wall time the producer waited for the writer (the database was the bottleneck).
    producer_blocked_s: float = 0.0
    batches: int = 0


class Pipeline(Generic[T]):
    """Iterate ``source`` on a producer thread; iterating the pipeline yields its items in lists.

    Use as a context manager: leaving it (normally or by an exception) stops and joins the producer.
    """

    def __init__(self, source: Iterable[T], *, batch: int, depth: int, name: str = "bos-load") -> None:
        if batch < 1 or depth < 1:
            raise ValueError("batch and depth must be at least 1")
        self._source = source
        self._batch = batch
        self._depth = depth
        self._ready: deque[list[T]] = deque()
        self._cond = threading.Condition()
        self._stopped = False  # set by the caller: the producer pulls nothing more
        self._done = False  # set by the producer when it ended (exhausted, failed or stopped)
        self._error: BaseException | None = None
        self.stats = PipelineStats()
        self._thread = threading.Thread(target=self._produce, name=name, daemon=True)
        self._started = False

    def __enter__(self) -> Pipeline[T]:
        self._thread.start()
        self._started = True
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def close(self) -> None:
        """Stop the producer (it pulls no further item) and wait for it to end."""
        with self._cond:
            self._stopped = True
            self._ready.clear()
            self._cond.notify_all()
        if self._started:
            self._thread.join()
            self._started = False
        self._error = None  # never kept past the load
        log.debug("load pipeline: %s", self.stats)

    # --- the producer thread --------------------------------------------------------------------

    def _produce(self) -> None:
        cpu = time.thread_time()
        cond, ready, depth, size = self._cond, self._ready, self._depth, self._batch
        batch: list[T] = []
        try:
            for item in self._source:
                batch.append(item)
                if len(batch) == size:
                    if not self._hand_over(batch, cond, ready, depth):
                        return
                    batch = []
                elif self._stopped:  # the writer gave up: do not read on
                    return
            if batch:
                self._hand_over(batch, cond, ready, depth)
        except BaseException as exc:  # noqa: BLE001 - re-raised in the calling thread, type and object preserved
            if batch and not self._stopped:
                self._hand_over(batch, cond, ready, depth)
            self._error = exc
        finally:
            self.stats.producer_cpu_s = time.thread_time() - cpu
            with cond:
                self._done = True
                cond.notify_all()

    def _hand_over(self, batch: list[T], cond: threading.Condition, ready: deque[list[T]], depth: int) -> bool:
        """Queue ``batch`` once the writer is at most ``depth`` lists behind; False if it stopped."""
        with cond:
            if len(ready) >= depth and not self._stopped:
                waited = time.perf_counter()
                while len(ready) >= depth and not self._stopped:
                    cond.wait()
                self.stats.producer_blocked_s += time.perf_counter() - waited
            if self._stopped:
                return False
            ready.append(batch)
            self.stats.batches += 1
            cond.notify_all()
        return True

    # --- the calling thread ---------------------------------------------------------------------

    def __iter__(self) -> Iterator[list[T]]:
        cond, ready = self._cond, self._ready
        cpu = time.thread_time()
        try:
            while True:
                with cond:
                    if not ready and not self._done:
                        waited = time.perf_counter()
                        while not ready and not self._done:
                            cond.wait()
                        self.stats.writer_starved_s += time.perf_counter() - waited
                    batch = ready.popleft() if ready else None
                    if batch is not None:
                        cond.notify_all()
                if batch is None:  # the producer ended and everything it handed over was written
                    self._thread.join()  # nothing runs on once the error surfaces
                    self._started = False
                    error, self._error = self._error, None
                    if error is not None:
                        raise error
                    return
                yield batch
        finally:
            self.stats.writer_cpu_s += time.thread_time() - cpu
