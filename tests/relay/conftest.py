import pytest

from spec_fused import log


@pytest.fixture(autouse=True)
def _fresh_log_once():
    """Each relay test starts and ends with no reason logged: "logged once" is read per
    test, never left to the order tests run in."""
    log.reset()
    yield
    log.reset()
