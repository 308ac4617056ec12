"""Deprecated aliases: the module paths treespec had before its subpackages.

``import treespec.engine`` (or ``from treespec.static import ...``) still works and warns with a
``DeprecationWarning`` naming the new path; the alias *is* the new module, so patching one patches
the other. Installed by ``treespec/__init__.py``; remove an entry once nobody needs it.
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.util
import sys
import warnings
from types import ModuleType

#: old name (under ``treespec.``) -> new name
MOVED = {
    "engine": "core.engine", "static": "core.compiled", "tree": "core.tree", "kv": "core.kv",
    "verify": "core.rule", "verifiers": "core.verifiers", "sampling": "core.sampling", "stats": "core.stats",
    "checks": "core.checks", "drafting": "core.drafting",
    "model_drafter": "drafters.model", "ngram": "drafters.ngram", "cross_drafter": "drafters.cross_tokenizer",
    "precision": "models.precision", "timing": "models.timing", "testing": "models.tiny",
    "acceptance": "calibrate.acceptance", "profile": "calibrate.costs", "tuning": "calibrate.tuning",
    "analysis": "calibrate.analysis",
    "baselines": "bench.baselines", "intervals": "bench.intervals", "datasets": "bench.datasets",
    "compare": "bench.compare", "demo": "bench.demo",
    # not sweep.report: importing a submodule rebinds the package's attribute of that name, and
    # treespec.bench.sweep.report is the report() function (reach it as treespec.sweep.report)
    "sweep": "bench.sweep", **{f"sweep.{m}": f"bench.sweep.{m}"
                               for m in ("cli", "config", "lock", "points", "records", "runner")},
}


def new_name(old: str) -> str | None:
    """The module that ``treespec.<old>`` moved to (full dotted name), or None if it did not move."""
    new = MOVED.get(old)
    return None if new is None else f"treespec.{new}"


class _AliasFinder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Finds ``treespec.<old>`` and hands back the module it moved to (its own ``__spec__`` kept)."""

    def find_spec(self, fullname: str, path=None, target=None):
        if fullname.startswith("treespec.") and new_name(fullname[len("treespec."):]) is not None:
            return importlib.util.spec_from_loader(fullname, self)
        return None

    def create_module(self, spec) -> ModuleType:
        new = new_name(spec.name[len("treespec."):])
        warnings.warn(f"{spec.name} has moved to {new}; import it from there (the old path will be removed)",
                      DeprecationWarning, stacklevel=3)
        module = importlib.import_module(new)
        self._specs = {**getattr(self, "_specs", {}), spec.name: module.__spec__}
        return module

    def exec_module(self, module: ModuleType) -> None:
        """The module is the new one, already executed; give it back its own spec (the import system
        has just set the alias's)."""
        module.__spec__ = self._specs.pop(module.__spec__.name)


def install() -> None:
    """Put the alias finder on ``sys.meta_path`` (once)."""
    if not any(isinstance(f, _AliasFinder) for f in sys.meta_path):
        sys.meta_path.insert(0, _AliasFinder())  # first: a moved package's submodules are on its new path too
