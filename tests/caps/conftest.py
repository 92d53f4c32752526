import pytest

from spec_fused import caps as caps_mod
from spec_fused.caps import register_caps


@pytest.fixture
def registered():
    """``register_caps`` for one test: every name registered is dropped after it."""
    names = []

    def register(name, caps):
        names.append(name.upper())
        register_caps(name, caps)

    yield register
    for name in names:
        caps_mod._REGISTERED.pop(name, None)
