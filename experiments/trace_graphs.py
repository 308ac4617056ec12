"""Where a captured step's device time goes, read from a ``torch.profiler`` chrome trace (``bench_gpu.py --trace``).

Each CUDA graph replay (one ``cudaGraphLaunch``: a draft level, a verification, a prefill chunk) is matched to its
kernels by the profiler's correlation ids. Per kind of graph (told apart by its kernel count), medians over the
replays after the first ``--skip`` (the profiler's warm-up slows the host at first):

* span: first kernel's start to last kernel's end; busy: the kernels' summed durations; the difference is the
  device idling *inside* the graph, between its kernels;
* idle before: the device idling between the previous graph's end and this one's start (the host late);
* the kernels with the most device time per replay;
* the idling inside the graph by the pair of kernels it falls between (the next kernel waits on what?).

    python experiments/trace_graphs.py experiments/results/gpu-h200-qkv/trace-events.json.gz
"""

from __future__ import annotations

import argparse
import gzip
import json
import statistics
from collections import defaultdict
from pathlib import Path
from typing import Any

DEVICE_WORK = ("kernel", "gpu_memcpy", "gpu_memset")


def graph_replays(trace: dict[str, Any]) -> list[dict[str, Any]]:
    """Every graph replay of the trace in time order: start, span, busy, kernel count, idle before, kernels."""
    events = trace["traceEvents"]
    launches = {e["args"]["correlation"] for e in events if e.get("cat") == "cuda_runtime"
                and e.get("name") == "cudaGraphLaunch" and "correlation" in e.get("args", {})}
    work: dict[int, list[dict[str, Any]]] = defaultdict(list)
    ends = []
    for e in events:
        if e.get("cat") in DEVICE_WORK:
            ends.append((e["ts"], e["ts"] + e["dur"]))
            if e["args"].get("correlation") in launches:
                work[e["args"]["correlation"]].append(e)
    ends.sort()
    out = []
    for kernels in work.values():
        start, end = min(k["ts"] for k in kernels), max(k["ts"] + k["dur"] for k in kernels)
        before = max((b for a, b in ends if b <= start), default=start)  # the last device work ending before it
        out.append({"start": start, "span": end - start, "busy": sum(k["dur"] for k in kernels),
                    "kernels": len(kernels), "idle_before": start - before, "work": kernels})
    return sorted(out, key=lambda r: r["start"])


def summary(replays: list[dict[str, Any]], skip: int, top: int) -> dict[int, dict[str, Any]]:
    """Per kind of graph (its kernel count): replays, median span / busy / idle before (us), the top kernels."""
    kinds: dict[int, list[dict[str, Any]]] = defaultdict(list)
    for r in replays[skip:]:
        kinds[r["kernels"]].append(r)
    out = {}
    for n, rs in sorted(kinds.items()):
        per: dict[str, list[float]] = defaultdict(list)
        for r in rs:
            for k in r["work"]:
                per[k["name"]].append(k["dur"])
        kernels = sorted(({"name": name[:90], "calls": len(d) / len(rs), "us_each": statistics.mean(d),
                           "us_per_replay": sum(d) / len(rs)} for name, d in per.items()),
                         key=lambda k: -k["us_per_replay"])
        out[n] = {"replays": len(rs), "span_us": statistics.median(r["span"] for r in rs),
                  "busy_us": statistics.median(r["busy"] for r in rs),
                  "idle_before_us": statistics.median(r["idle_before"] for r in rs), "top": kernels[:top],
                  "gaps": idle_between(rs)[:top]}
    return out


def idle_between(replays: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The device's idling inside these replays by the pair of kernels it falls between, the most first: us per
    replay, the median gap, and how often the pair follows in a replay."""
    gaps: dict[tuple[str, str], list[float]] = defaultdict(list)
    for r in replays:
        work = sorted(r["work"], key=lambda k: k["ts"])
        for a, b in zip(work, work[1:]):
            gaps[a["name"][:60], b["name"][:60]].append(max(b["ts"] - a["ts"] - a["dur"], 0.0))
    rows = [{"after": a, "before": b, "us_per_replay": sum(d) / len(replays), "median_us": statistics.median(d),
             "per_replay": len(d) / len(replays)} for (a, b), d in gaps.items()]
    return sorted(rows, key=lambda g: -g["us_per_replay"])


def report(path: Path, kinds: dict[int, dict[str, Any]]) -> str:
    lines = [f"# {path.name}", "",
             "| kernels per replay | replays | span us | busy us | idle inside us | idle before us |",
             "|---|---|---|---|---|---|"]
    lines += [f"| {n} | {k['replays']} | {k['span_us']:.0f} | {k['busy_us']:.0f} | {k['span_us'] - k['busy_us']:.0f} | "
              f"{k['idle_before_us']:.0f} |" for n, k in kinds.items()]
    for n, k in kinds.items():
        lines += ["", f"## Graphs of {n} kernels: top kernels per replay", "",
                  "| kernel | calls | us each | us per replay |", "|---|---|---|---|"]
        lines += [f"| `{t['name']}` | {t['calls']:.0f} | {t['us_each']:.2f} | {t['us_per_replay']:.1f} |"
                  for t in k["top"]]
        lines += ["", f"## Graphs of {n} kernels: idling inside by the kernels it falls between", "",
                  "| after | before | times per replay | median gap us | us per replay |", "|---|---|---|---|---|"]
        lines += [f"| `{g['after']}` | `{g['before']}` | {g['per_replay']:.0f} | {g['median_us']:.2f} | "
                  f"{g['us_per_replay']:.1f} |" for g in k["gaps"]]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("traces", nargs="+", type=Path, help="chrome traces (.json or .json.gz)")
    ap.add_argument("--skip", type=int, default=14, help="graph replays to leave out at the start (warm-up)")
    ap.add_argument("--top", type=int, default=12, help="kernels listed per kind of graph")
    args = ap.parse_args(argv)
    for path in args.traces:
        opener = gzip.open if path.suffix == ".gz" else open
        with opener(path, "rt") as f:
            trace = json.load(f)
        print(report(path, summary(graph_replays(trace), args.skip, args.top)))


if __name__ == "__main__":
    main()
