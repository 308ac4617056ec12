"""The README's runnable example stays runnable."""

import runpy
from pathlib import Path


def test_api_example_runs(capsys):
    runpy.run_path(str(Path(__file__).parents[1] / "experiments" / "example_api.py"), run_name="__main__")
    out = capsys.readouterr().out
    assert "identical to plain greedy: True" in out
