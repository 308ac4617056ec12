"""The package layout: old module paths still import (deprecated), as the very modules that moved."""

import importlib
import sys
import warnings

import pytest

from treespec import _moved


@pytest.mark.parametrize("old", sorted(_moved.MOVED))
def test_old_module_paths_are_deprecated_aliases_of_the_moved_modules(old: str) -> None:
    new = importlib.import_module(f"treespec.{_moved.MOVED[old]}")
    sys.modules.pop(f"treespec.{old}", None)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        alias = importlib.import_module(f"treespec.{old}")
    assert alias is new  # one module object: patching either patches both
    assert any(issubclass(w.category, DeprecationWarning) and _moved.MOVED[old] in str(w.message) for w in caught)


def test_an_unknown_name_is_still_an_attribute_error() -> None:
    import treespec

    with pytest.raises(AttributeError):
        treespec.no_such_module  # noqa: B018
