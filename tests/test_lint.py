"""The code passes ruff's pycodestyle and pyflakes rules at 120 columns (``[tool.ruff]`` in pyproject.toml):
unused imports and names, undefined names, long lines."""

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def ruff(*paths: str | Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "ruff", "check", "--output-format", "concise", *map(str, paths)],
                          cwd=ROOT, capture_output=True, text=True)


def test_the_code_passes_ruff():
    done = ruff("treespec", "tree_builders", "tests", "experiments")
    assert done.returncode == 0, done.stdout + done.stderr


def test_ruff_finds_what_it_should(tmp_path):  # the control: the same call fails on a file that breaks the rules
    bad = tmp_path / "bad.py"
    bad.write_text("import os\n\nx = '" + "y" * 130 + "'\nprint(undefined_name)\n")
    done = ruff(bad)
    assert done.returncode == 1
    assert all(code in done.stdout for code in ("F401", "E501", "F821")), done.stdout
