"""Hypothesis profiles for the MCP room: ``bos-ci`` (default, ~200 examples) and ``bos-long``.

Choose with ``BOS_HYPOTHESIS_PROFILE=bos-long``; property tests apply the chosen profile via
``settings(settings.get_profile(...))`` so other rooms' hypothesis settings are untouched.
"""

from __future__ import annotations

from hypothesis import HealthCheck, settings

settings.register_profile(
    "bos-ci", max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow]
)
settings.register_profile(
    "bos-long", max_examples=5000, deadline=None, suppress_health_check=[HealthCheck.too_slow]
)
