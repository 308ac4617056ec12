"""Shared test setup: slow real-model checks run only when asked (TREESPEC_SLOW=1 or -m slow)."""

import os

import pytest


def pytest_collection_modifyitems(config, items):
    if os.environ.get("TREESPEC_SLOW") == "1" or "slow" in (config.getoption("-m") or ""):
        return
    skip = pytest.mark.skip(reason="slow real-model check; set TREESPEC_SLOW=1 (or run `make slow`)")
    for item in items:
        if "slow" in item.keywords:
            item.add_marker(skip)
