"""Suite-wide settings.

Hypothesis runs derandomized under CI (``CI=true``): a submission's CI run is reproducible, and a
failure there fails again the same way on a developer's machine. Locally, examples are random, so
every run explores new cases; a failure prints its reproduction blob either way.
"""

from __future__ import annotations

import os

from hypothesis import HealthCheck, settings

settings.register_profile(
    "ci",
    derandomize=True,
    deadline=None,
    print_blob=True,
    suppress_health_check=[HealthCheck.too_slow],
)
settings.register_profile(
    "dev", deadline=None, print_blob=True, suppress_health_check=[HealthCheck.too_slow]
)
settings.load_profile("ci" if os.environ.get("CI") == "true" else "dev")
