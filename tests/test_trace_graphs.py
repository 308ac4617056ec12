"""experiments/trace_graphs.py on a made-up profiler trace: graph replays matched to their kernels, the idling
inside and before them, and the idling by the pair of kernels it falls between."""

import runpy
from pathlib import Path

import pytest


@pytest.fixture(scope="module")
def tg() -> dict:
    return runpy.run_path(str(Path(__file__).resolve().parents[1] / "experiments" / "trace_graphs.py"))


def kernel(name: str, ts: float, dur: float, corr: int) -> dict:
    return {"cat": "kernel", "name": name, "ts": ts, "dur": dur, "args": {"correlation": corr}}


def launch(corr: int, ts: float) -> dict:
    return {"cat": "cuda_runtime", "name": "cudaGraphLaunch", "ts": ts, "dur": 5.0, "args": {"correlation": corr}}


def test_replays_spans_idling_and_gaps_by_kernel_pair(tg):
    # two replays of a 3-kernel graph: a (2 us), then a 4 us gap, b (3 us), a 1 us gap, c (1 us); the second
    # replay starts 10 us after the first ends; a kernel launched alone (not a graph) between them is not a replay
    events = [launch(1, 0.0), launch(2, 30.0), {"cat": "cuda_runtime", "name": "cudaLaunchKernel", "ts": 20.0,
                                                  "dur": 1.0, "args": {"correlation": 3}}]
    for corr, t0 in ((1, 10.0), (2, 31.0)):
        events += [kernel("a", t0, 2.0, corr), kernel("b", t0 + 6.0, 3.0, corr), kernel("c", t0 + 10.0, 1.0, corr)]
    events.append(kernel("lone", 22.0, 1.0, 3))
    replays = tg["graph_replays"]({"traceEvents": events})
    assert [r["kernels"] for r in replays] == [3, 3]
    assert [r["span"] for r in replays] == [11.0, 11.0] and [r["busy"] for r in replays] == [6.0, 6.0]
    assert replays[1]["idle_before"] == 31.0 - 23.0  # after the lone kernel, the last work before it
    (kind,) = tg["summary"](replays, skip=0, top=5).values()
    assert kind["replays"] == 2 and kind["span_us"] - kind["busy_us"] == 5.0
    gaps = {(g["after"], g["before"]): g["us_per_replay"] for g in kind["gaps"]}
    assert gaps == {("a", "b"): 4.0, ("b", "c"): 1.0}
    assert "| `a` | `b` | 1 | 4.00 | 4.0 |" in tg["report"](Path("t.json"), {3: kind})
