"""The personal-data policy's stream transform alone: ``python -m bench.pii_transform``.

Times :meth:`PolicyRun.stored_records` over the bench scenario's final records as the read hands
them over (each decoded from its wire bytes into a ``WireRecord`` carrying its wire hash), under
the bench's policy and key (``bench/run --pii``'s), with nothing else: no HTTP, no writer. The read
decodes each record just before the transform sees it, so it is in the CPU's caches: the records
are the scenario's first :data:`POOL`, repeated (200k distinct records built beforehand would make
every record a trip to memory, which a sync does not pay here). Each round is CPU time.

``--against REF`` times the transform of a git ref beside this checkout's, round by round in two
child processes (each imports its own ``airflow_provider_bos``), so a slow phase of the machine hits
both alike; each line is the median of the rounds.
"""

from __future__ import annotations

import argparse
import gc
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections import deque
from pathlib import Path
from typing import Any

_REPO = Path(__file__).resolve().parent.parent
#: Distinct records, repeated: about what a read decodes between two looks of the transform.
POOL = 512


def wire_records(count: int) -> list[Any]:
    """``count`` final records as the read decodes them (a ``WireRecord`` with its wire hash): the
    scenario's first :data:`POOL`, repeated."""
    import itertools

    import orjson

    from airflow_provider_bos.wire import WireRecord, wire_hash
    from bench.data import ScenarioParams, iter_final_records

    pool: list[Any] = []
    for record in itertools.islice(iter_final_records(ScenarioParams(records=count)), POOL):
        piece = orjson.dumps(record)  # compact, in the server's key order, as the scanner cuts it
        decoded = WireRecord(orjson.loads(piece))
        decoded.wire_hash = wire_hash(piece)
        pool.append(decoded)
    return [pool[i % len(pool)] for i in range(count)]


def policy_run() -> Any:
    from airflow_provider_bos.pii import PiiKey, PiiPolicy
    from airflow_provider_bos.pii.stream import PolicyRun
    from bench.ours import _BENCH_PII_KEY, BENCH_PII_POLICY

    return PolicyRun.of(PiiPolicy.parse(BENCH_PII_POLICY), PiiKey.from_text(_BENCH_PII_KEY, source="bench"))


def time_once(run: Any, records: list[Any]) -> float:
    """CPU seconds to transform every record (each stored record dropped at once, as the writer would).

    CPU time, not wall time: the transform is one thread of pure computation, and on a shared machine
    wall time also counts the time other processes had the core."""
    started = time.process_time()
    deque(run.stored_records(iter(records), None), maxlen=0)
    return time.process_time() - started


def serve(count: int) -> None:
    """The child: build the records once, then one timed transform per line read, its seconds printed."""
    records = wire_records(count)
    run = policy_run()
    gc.disable()  # as during a sync (sync.cyclic_gc_paused)
    print("ready", flush=True)
    for _ in sys.stdin:
        print(f"{time_once(run, records):.6f}", flush=True)


def _child(tree: Path | None, count: int) -> subprocess.Popen[str]:
    """A :func:`serve` process importing ``airflow_provider_bos`` from ``tree`` (this checkout if None)."""
    front = f"sys.path.insert(0, {str(tree)!r}); " if tree is not None else ""
    code = f"import sys; {front}from bench.pii_transform import serve; serve({count})"
    child = subprocess.Popen([sys.executable, "-c", code], cwd=_REPO, text=True,
                             stdin=subprocess.PIPE, stdout=subprocess.PIPE)
    assert child.stdout is not None
    if child.stdout.readline().strip() != "ready":
        raise SystemExit(f"the transform child for {tree or 'this checkout'} did not start")
    return child


def _export(ref: str, into: Path) -> Path:
    """``airflow_provider_bos`` as it is at git ``ref``, unpacked under ``into``."""
    archive = subprocess.run(["git", "-C", str(_REPO), "archive", ref, "airflow_provider_bos"],
                             check=True, capture_output=True).stdout
    subprocess.run(["tar", "-x", "-C", str(into)], input=archive, check=True)
    return into


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.pii_transform", description=__doc__.splitlines()[0])
    parser.add_argument("--records", type=int, default=200_000)
    parser.add_argument("--repeat", type=int, default=7, help="interleaved rounds (default 7)")
    parser.add_argument("--against", metavar="REF", help="also time the transform of this git ref")
    args = parser.parse_args(argv)

    tmp = Path(tempfile.mkdtemp(prefix="bench_pii_"))
    trees: dict[str, Path | None] = {"this checkout": None}
    if args.against:
        trees[args.against] = _export(args.against, tmp)
    children = {name: _child(tree, args.records) for name, tree in trees.items()}
    seconds: dict[str, list[float]] = {name: [] for name in trees}
    try:
        for _ in range(args.repeat):
            for name, child in children.items():
                assert child.stdin is not None and child.stdout is not None
                child.stdin.write("go\n")
                child.stdin.flush()
                seconds[name].append(float(child.stdout.readline()))
    finally:
        for child in children.values():
            if child.stdin is not None:
                child.stdin.close()
            child.wait()
        shutil.rmtree(tmp, ignore_errors=True)
    print(f"bench.pii_transform  {args.records:,} records ({POOL} distinct)  {args.repeat} interleaved rounds")
    for name, rounds in seconds.items():
        median = statistics.median(rounds)
        print(f"{name:>24s}: {median:7.3f} cpu s median = {median / args.records * 1e6:5.2f} us/record  "
              f"(rounds {' '.join(f'{s:.3f}' for s in rounds)})")
    if args.against:
        now, then = (statistics.median(seconds[name]) for name in trees)
        print(f"this checkout / {args.against}: {now / then:.2f}x the time")
    return 0


if __name__ == "__main__":
    sys.exit(main())
