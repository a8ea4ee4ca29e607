"""The native engine's tests run where it was built. CI builds it (pip install -e .), so there a missing
engine fails them rather than skipping them, unless LPT_ONEDNN=off turned it off on purpose."""

import os

import pytest

import lpt.native

REQUIRED = bool(os.environ.get("CI")) and os.environ.get("LPT_ONEDNN", "").strip().lower() != "off"


@pytest.fixture(autouse=True)
def native_engine():
    if not lpt.native.available():
        if REQUIRED:
            pytest.fail(f"CI builds lpt's native engine, but it is not available: {lpt.native.unavailable_reason()}")
        pytest.skip(f"lpt's native engine is not available: {lpt.native.unavailable_reason()}")
