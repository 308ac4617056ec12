"""experiments/bench_batch.py resumes only records made as the run makes them (its tree per batch size, HF assisted
in its setting), so a re-run never mixes two configurations in one summary."""

import runpy
from pathlib import Path

bench = runpy.run_path(str(Path(__file__).resolve().parents[1] / "experiments" / "bench_batch.py"))
current_records = bench["current_records"]


made_as = bench["made_as"]


def _rec(b: int, method: str, group: int = 0, **extra) -> dict:
    return {"batch_size": b, "dataset": "humaneval", "group": group, "method": method, **extra}


def test_hf_assisted_in_another_setting_reruns_its_batch_size_every_method_and_resumes() -> None:
    trees = {1: "budget 8, depth 4", 2: "budget 8, depth 3"}

    def made(setting):
        return [_rec(b, m, made_as=made_as(trees, setting, b))
                for b, ms in ((1, ("hf", "hf-assisted", "treespec")), (2, ("hf", "treespec"))) for m in ms]

    old = made("HF's default")
    assert current_records(old, trees, "HF's default") == old
    assert current_records(old, trees, "4 drafted tokens") == old[3:]  # B = 1 runs again, every method; B = 2 stays
    rerun = [*old, *made("4 drafted tokens")[:2]]  # then interrupted after two methods
    assert current_records(rerun, trees, "4 drafted tokens") == [*old[3:], *rerun[-2:]]
    assert current_records(rerun, {2: trees[2]}, None) == rerun  # a run of B = 2 alone keeps every other record


def test_records_made_before_made_as_resume_by_their_tree_and_setting() -> None:
    trees = {1: "budget 8, depth 4", 2: "budget 8, depth 3"}
    old = [_rec(1, "hf"), _rec(1, "hf-assisted", assisted_setting="HF's default"), _rec(1, "treespec", tree=trees[1]),
           _rec(2, "hf"), _rec(2, "treespec", tree="budget 16, depth 6")]
    assert current_records(old, trees, "HF's default") == old[:3]  # B = 2 ran another tree
    assert current_records(old, trees, "4 drafted tokens") == []
    unrecorded = [_rec(1, "hf"), _rec(1, "hf-assisted"), _rec(1, "treespec", tree=trees[1])]
    assert current_records(unrecorded, trees, "HF's default") == []  # HF assisted's setting not known: run again
