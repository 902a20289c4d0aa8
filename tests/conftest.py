"""Hypothesis profiles shared by the whole suite.

- "ci" (the default): bounded examples, no deadline (2-core CI machines are slow and
  Numba compiles on first call).
- "derandomized": the same, with a fixed seed, for reproducing a run exactly.
- "dev": more examples, for a deeper local search.
Select with HYPOTHESIS_PROFILE=<name>.
"""

import os

from hypothesis import HealthCheck, settings

settings.register_profile(
    "ci",
    max_examples=40,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
    print_blob=True,
)
settings.register_profile(
    "derandomized",
    parent=settings.get_profile("ci"),
    derandomize=True,
)
settings.register_profile("dev", parent=settings.get_profile("ci"), max_examples=300)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci"))
