"""A package whose public names are imported on first use (PEP 562's module ``__getattr__``): importing the package
imports none of its modules, so a command parses its options and answers ``--help`` before torch is imported."""

from __future__ import annotations

import importlib
import sys
from typing import Any, Callable


def exports(package: str, homes: dict[str, str]) -> tuple[Callable[[str], Any], Callable[[], list[str]]]:
    """The ``__getattr__`` and ``__dir__`` of ``package``, whose names are imported from their ``homes`` (name ->
    module, relative to the package; a home named like the name is the module itself) when first read, then kept
    as plain attributes of the package."""
    def __getattr__(name: str) -> Any:
        home = homes.get(name)
        if home is None:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        module = importlib.import_module(home, package)
        value = module if home.rsplit(".", 1)[-1] == name else getattr(module, name)
        setattr(sys.modules[package], name, value)
        return value

    def __dir__() -> list[str]:
        return sorted({*vars(sys.modules[package]), *homes})

    return __getattr__, __dir__
