"""``python -m bench`` (what ``bench/run`` execs)."""

from __future__ import annotations

import sys

from bench.cli import main

sys.exit(main())
