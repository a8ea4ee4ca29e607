"""Test-wide settings."""

import os

from hypothesis import settings

# CI replays the same examples every run, so a landing never hinges on what a random seed finds;
# developers' runs keep exploring new ones.
settings.register_profile("ci", derandomize=True)
if os.environ.get("CI"):
    settings.load_profile("ci")
