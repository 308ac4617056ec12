"""Every script under ``experiments/`` answers ``--help`` (its imports still resolve against the package as it is
now, and it parses its options before any work).

The scripts run in this test's process, one after another, as ``python script.py --help`` would run them
(``runpy`` as ``__main__``): the worker has imported torch and transformers already, so the whole check takes about
2 s where a fresh interpreter took 11 (its imports). What a script changes on its way to ``--help`` is put back
after it: ``sys.argv``, ``sys.path`` (the script's folder first, as Python puts it; most scripts put the checkout
first too) and the modules it imported from ``experiments/`` (its helpers, e.g. ``gpu_protocol``), so that later
tests import them as they would alone."""

from __future__ import annotations

import contextlib
import io
import runpy
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
#: the README's API example: kept bare (no options) so it reads as the README shows it
BARE = {"example_api.py"}


def of_experiments(name: str) -> bool:
    """Whether the imported module ``name`` is a file under ``experiments/``."""
    return str(ROOT / "experiments") in str(getattr(sys.modules[name], "__file__", None) or "")


@contextlib.contextmanager
def as_main(path: Path):
    """``sys.argv`` and ``sys.path`` of ``python path --help`` (its folder first) for the block; then both, and the
    experiments' own modules, as before."""
    argv, search, modules = sys.argv, list(sys.path), set(sys.modules)
    sys.argv = [str(path), "--help"]
    sys.path.insert(0, str(path.parent))
    try:
        yield
    finally:
        sys.argv, sys.path[:] = argv, search
        for name in [m for m in set(sys.modules) - modules if of_experiments(m)]:
            del sys.modules[name]


def help_failure(path: Path) -> str | None:
    """Why ``path --help`` did not exit cleanly, or None."""
    try:
        with as_main(path), contextlib.redirect_stdout(io.StringIO()):
            runpy.run_path(str(path), run_name="__main__")
    except SystemExit as exit_:
        return None if exit_.code in (0, None) else f"{path.name}: --help exited {exit_.code}"
    except Exception as error:  # an import that rotted, an option that no longer parses
        return f"{path.name}: {type(error).__name__}: {error}"
    return f"{path.name}: ran without exiting at --help"


def test_every_experiment_answers_help():
    scripts = sorted(p for p in (ROOT / "experiments").glob("*.py") if p.name not in BARE)
    assert len(scripts) > 40
    assert [f for f in map(help_failure, scripts) if f] == []


def test_a_script_that_fails_at_help_is_named(tmp_path):
    """The negative controls: a script whose import fails, one that exits with an error, one that ignores
    ``--help``; and the experiments' modules are left as they were."""
    broken = tmp_path / "broken.py"
    broken.write_text("import treespec.no_such_module\n")
    erring = tmp_path / "erring.py"
    erring.write_text("import sys\nsys.exit(2)\n")
    running = tmp_path / "running.py"
    running.write_text("x = 1\n")
    assert "broken.py: ModuleNotFoundError" in help_failure(broken)
    assert help_failure(erring) == "erring.py: --help exited 2"
    assert help_failure(running) == "running.py: ran without exiting at --help"
    path, modules = list(sys.path), set(sys.modules)
    assert help_failure(ROOT / "experiments" / "bench_gpu.py") is None
    assert sys.path == path and not [m for m in set(sys.modules) - modules if of_experiments(m)]
