"""hypothesis profiles of the property suite (applied by ``harness.PROFILE``, per test).

``ci`` (the default, also under ``CI=true``): derandomized, a bounded number of examples, the
whole suite within a few minutes on a 2-core machine.  ``thorough``
(``HYPOTHESIS_PROFILE=thorough``): thousands of examples per property, fresh random seeds, for
long runs.  ``dev``: a quick random run.  The profile is passed to each property's
``@settings`` rather than loaded globally, so tests elsewhere keep their own settings.
"""

from hypothesis import HealthCheck, settings

_COMMON = dict(
    deadline=None,  # tvm.compile time varies with machine load
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
    print_blob=True,
)

settings.register_profile("ci", max_examples=300, derandomize=True, database=None, **_COMMON)
settings.register_profile("dev", max_examples=30, **_COMMON)
settings.register_profile("thorough", max_examples=5000, **_COMMON)
