"""Sweeps over Ray workers (Ray's local cluster, started here): the same points, outputs and tau as one
process; a killed worker loses no point; a killed driver resumes; the missing extra is named.

The tests that start Ray share one local Ray (a module fixture) and one pytest-xdist worker
(``xdist_group``); they are skipped where the ``ray`` extra is not installed (``make test`` installs it)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

import treespec.bench.sweep as E
from treespec.bench.sweep import distributed
from treespec.bench.sweep.records import comparable, read_records

ROOT = Path(__file__).resolve().parents[1]
TINY = ROOT / "experiments" / "configs" / "tiny.toml"


def _config() -> dict:
    cfg = E.load_config(TINY)
    cfg["grid"].update(builders=["chain"], budgets=[4, 8])  # no acceptance measurement: seconds per point
    cfg["baselines"]["methods"] = ["target"]
    return cfg


def _by_key(path: Path) -> dict:
    return {r["key"]: r for r in read_records(path)}


@pytest.fixture(scope="module")
def ray():
    ray = pytest.importorskip("ray")
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    yield ray
    ray.shutdown()


@pytest.mark.xdist_group("ray")
def test_a_killed_worker_loses_no_point_a_killed_driver_resumes_and_two_workers_give_the_points_of_one_process(
        ray, tmp_path: Path) -> None:
    """One run on two workers (a baseline, then two points) loses worker 0 after the baseline; the point it is
    handed next goes to a new worker 0 (the only one left for it: if it were lost, the run would end without
    it), and the driver dies as that point's record comes. A re-run (in one process: resuming reads the
    driver's records, whoever ran them) finishes the sweep. Three worker processes in all (each imports torch:
    the test's time)."""
    cfg = _config()
    killed = []

    def kill_then_die(record: dict) -> None:
        if killed and record["meta"]["worker"] == 0:
            raise KeyboardInterrupt
        if not killed and distributed.ACTIVE:
            killed.append(distributed.ACTIVE[0])
            ray.kill(distributed.ACTIVE[0])

    with pytest.raises(KeyboardInterrupt):
        E.sweep(cfg, tmp_path / "there", progress=False, make_report=False, workers=2, share_cpu=True,
                on_point=kill_then_die)
    first = _by_key(tmp_path / "there" / "results.jsonl")
    assert killed and len(first) >= 2 and all(r["status"] == "ok" and r["meta"]["shared_cpu"] for r in first.values())
    b = _by_key(E.sweep(cfg, tmp_path / "there", progress=False, make_report=False))  # the resumed run
    assert len(b) == 3 and all(r["status"] == "ok" for r in b.values())
    assert all(b[k] == first[k] for k in first)  # the finished points are kept as they were
    a = _by_key(E.sweep(cfg, tmp_path / "here", progress=False, make_report=False))
    assert set(a) == set(b)
    for key in a:  # same greedy outputs, tau and counts; timings and where it ran aside
        assert comparable(a[key])["result"] == comparable(b[key])["result"], key
    assert all(b[k].get("speedup", {}).get("target") for k in first if b[k]["kind"] == "treespec")


@pytest.mark.xdist_group("ray")
def test_cpu_workers_sharing_one_machine_are_refused_unless_asked(ray, tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="share this machine's cores"):
        E.sweep(_config(), tmp_path, progress=False, make_report=False, workers=2)


def test_workers_without_ray_installed_say_how_to_install_it(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setitem(sys.modules, "ray", None)  # what an environment without the extra sees
    with pytest.raises(ImportError, match=r"pip install 'treespec\[ray\]'"):
        E.sweep(_config(), tmp_path, progress=False, make_report=False, workers=2, share_cpu=True)
