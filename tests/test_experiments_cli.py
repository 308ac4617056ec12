"""Every script under ``experiments/`` answers ``--help`` (its imports still resolve against the package as it is
now, and it parses its options before any work): one subprocess runs them all in turn."""

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
#: the README's API example: kept bare (no options) so it reads as the README shows it
BARE = {"example_api.py"}

CHECK = """
import contextlib, io, runpy, sys
failed = []
for path in sys.argv[1:]:
    sys.argv = [path, "--help"]
    try:
        with contextlib.redirect_stdout(io.StringIO()):
            runpy.run_path(path, run_name="__main__")
        failed.append(f"{path}: ran without exiting at --help")
    except SystemExit as exit_:
        if exit_.code not in (0, None):
            failed.append(f"{path}: --help exited {exit_.code}")
    except Exception as error:
        failed.append(f"{path}: {type(error).__name__}: {error}")
print("\\n".join(failed))
"""


def test_every_experiment_answers_help():
    scripts = sorted(str(p) for p in (ROOT / "experiments").glob("*.py") if p.name not in BARE)
    assert len(scripts) > 40
    done = subprocess.run([sys.executable, "-c", CHECK, *scripts], capture_output=True, text=True, cwd=ROOT,
                          timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip() == "", done.stdout
