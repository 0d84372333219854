"""The provider registers a bounded number of secrets per process, with Airflow's masker and its own."""

from __future__ import annotations

import subprocess
import sys
import textwrap

PROGRAM = textwrap.dedent(
    """
    from airflow_provider_bos import redaction

    received = []
    redaction.add_secret_sink(received.append)
    for i in range(redaction.MAX_SECRETS * 3):
        redaction.register_secret(f"secret-value-{i:06d}")
        redaction.register_secret(f"secret-value-{i:06d}")  # a value seen again is not sent again
    late = []
    redaction.add_secret_sink(late.append)
    newest = f"secret-value-{redaction.MAX_SECRETS * 3 - 1:06d}"
    print(redaction.MAX_SECRETS, redaction.known_secret_count(), len(received), len(late),
          redaction.redact(newest), len(set(received)) == len(received))
    """
)


def test_registrations_are_bounded_per_process() -> None:
    # A process of its own: the registry is process-wide, and this fills it.
    out = subprocess.run([sys.executable, "-c", PROGRAM], capture_output=True, text=True, check=True)
    bound, known, received, late, newest_redacted, distinct = out.stdout.split()
    assert int(known) <= int(bound) and int(received) <= int(bound) and int(late) <= int(bound)
    assert newest_redacted == "***"  # the most recent secrets are still redacted
    assert distinct == "True"
    assert "more than" in out.stderr  # said once, in the log
