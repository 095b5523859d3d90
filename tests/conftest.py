"""Test-wide settings.

Property-based tests draw their examples from a fixed seed (hypothesis ``derandomize``), so
a run is reproducible and a red CI run can be replayed exactly: the fuzzers' tallies (for
example "at least one clean error among 30 examples") once failed on an unlucky random
draw. ``HYPOTHESIS_PROFILE=explore`` draws fresh random examples on every run, for hunting
new failures locally.
"""

import os

from hypothesis import settings

settings.register_profile("fixed", derandomize=True)
settings.register_profile("explore", derandomize=False)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "fixed"))


import pytest  # noqa: E402


@pytest.fixture
def without_blocked(monkeypatch):
    """Dispatch as on a host without the ``blocked`` kernel, so that a test can pin the
    rules of the other kernels (``blocked`` is chosen before them where it runs)."""
    from convgrad.kernels import blocked
    monkeypatch.setattr(blocked, "available", lambda: False)
