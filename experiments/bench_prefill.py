"""The compiled steps' prompt prefill on this CPU: fixed 64-token chunks against exact pieces, and both against
the eager prefill.

The target (Qwen2.5-Coder 1.5B, bfloat16, inductor with weight freezing, as ``treespec generate
--compile`` runs it) caches each benchmark prompt through ``treespec.core.prefill.ChunkedPrefill``
in both cuttings, interleaved per prompt, best of ``--repeats``:

* ``chunks-64``: one static graph of 64 tokens, the last chunk padded (what CUDA graphs need);
* ``exact``: one graph with a dynamic token count, the prompt in as few near-equal pieces of at most
  512 tokens as fit, no padding (what every other backend runs);
* ``eager``: no graph: the prompt through the model's own causal forward into a growable cache, its keys and values
  copied into the static cache's slots (``EagerPrefill``: what an int4 model's compiled steps run, and short
  prompts').

A third row times single static graphs of width 16 / 64 / 256 per token, which separates a call's
fixed cost (the weights streaming through once) from its cost per token. Prompts: HumanEval 100-109
and Lee news leads 0-9, the sets of ``bench_fastest.py``.

    python experiments/bench_prefill.py --out experiments/results/prefill-cpu.md
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path
from typing import Callable

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from a checkout without installing

from treespec.bench.datasets import dataset_prompts  # noqa: E402
from treespec.common.machine import machine  # noqa: E402
from treespec.core.compiling import allow_recompiles  # noqa: E402
from treespec.core.static_cache import StaticTreeCache  # noqa: E402
from treespec.core.prefill import ChunkedPrefill, EagerPrefill, padded_length, pieces  # noqa: E402
from treespec.models.loading import load  # noqa: E402
from treespec.models.packaged import DEFAULT_TARGET  # noqa: E402

SETS = (("humaneval", range(100, 110)), ("lee-news", range(0, 10)))


def best_of(fill: Callable[[list[int]], None], prompt: list[int], repeats: int) -> float:
    times = []
    for _ in range(repeats):
        t = time.perf_counter()
        fill(prompt)
        times.append(time.perf_counter() - t)
    return min(times)


def main(argv: list[str] | None = None) -> str:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", type=Path, default=Path("experiments/results/prefill-cpu.md"))
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--widths", type=int, nargs="*", default=[16, 64, 256],
                    help="static graph widths timed per call (one compile each; none: skip)")
    args = ap.parse_args(argv)
    allow_recompiles()
    torch.set_grad_enabled(False)
    target, tok = load(DEFAULT_TARGET, dtype="bfloat16", role="target")
    cache = StaticTreeCache(target, 1024)
    with torch._inductor.config.patch(freezing=True):
        eager = EagerPrefill(target, cache)
        fills = {"chunks-64": ChunkedPrefill(target, cache, "inductor", None, chunk=64, fixed=True),
                 "exact": ChunkedPrefill(target, cache, "inductor", None),
                 "eager": lambda prompt: eager.rows([prompt])}
        compile_s = {}
        for name, fill in fills.items():
            t = time.perf_counter()
            fill(list(range(1000, 1000 + 71)))  # compiles (eager: its first call)
            compile_s[name] = time.perf_counter() - t
        rows, sums = [], {name: {} for name in fills}
        for dataset, indices in SETS:
            texts = dataset_prompts(dataset)
            for i in indices:
                prompt = tok(texts[i])["input_ids"]
                n = len(prompt) - 1
                secs = {name: best_of(fill, prompt, args.repeats) for name, fill in fills.items()}
                for name in fills:
                    sums[name][dataset] = sums[name].get(dataset, 0.0) + secs[name]
                rows.append((dataset, i, n, padded_length(n) // 64, len(pieces(n)), secs))
                print(dataset, i, n, {k: round(v, 3) for k, v in secs.items()}, flush=True)
        per_call = {}  # seconds of one call of a static graph of each width
        for width in args.widths:
            fill = ChunkedPrefill(target, cache, "inductor", None, chunk=width, fixed=True)
            prompt = list(range(1000, 1000 + width + 1))
            fill(prompt)  # compiles
            per_call[width] = statistics.median(best_of(fill, prompt, 1) for _ in range(3))
            del fill
    ends = (min(per_call), max(per_call)) if len(per_call) > 1 else None
    slope = (per_call[ends[1]] - per_call[ends[0]]) / (ends[1] - ends[0]) if ends else None  # seconds per token
    lines = [f"# Compiled prefill: fixed 64-token chunks against exact pieces, and eager ({machine('cpu')}, "
             f"torch {torch.__version__})",
             "", f"Command: `python experiments/bench_prefill.py {' '.join(sys.argv[1:] if argv is None else argv)}`. "
             f"Target {DEFAULT_TARGET}, bfloat16, "
             f"inductor with weight freezing; seconds to cache each prompt (best of {args.repeats}, "
             "cuttings interleaved "
             "per prompt). First call (compiles; eager: its warm-up): "
             + ", ".join(f"{k} {v:.0f} s" for k, v in compile_s.items()) + ".",
             "", "| set | prompt | tokens cached | 64-token chunks | exact pieces | chunks-64 s | exact s | eager s | "
             "exact / chunks | eager / exact |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    for dataset, i, n, chunks, k, secs in rows:
        lines.append(f"| {dataset} | {i} | {n} | {chunks} | {k} | {secs['chunks-64']:.3f} | {secs['exact']:.3f} | "
                     f"{secs['eager']:.3f} | {secs['exact'] / secs['chunks-64']:.2f} | "
                     f"{secs['eager'] / secs['exact']:.2f} |")
    lines += ["", "| set | chunks-64 s (sum) | exact s (sum) | eager s (sum) | exact / chunks | eager / exact |",
              "|---|---|---|---|---|---|"]
    for dataset, _ in SETS:
        a, b, e = (sums[name][dataset] for name in ("chunks-64", "exact", "eager"))
        lines.append(f"| {dataset} | {a:.2f} | {b:.2f} | {e:.2f} | {b / a:.2f} | {e / b:.2f} |")
    if per_call:
        lines += ["", "One static graph per width, seconds per call (median of 3): "
                  + ", ".join(f"{w} tokens {s * 1e3:.0f} ms ({s / w * 1e3:.1f} ms per token)"
                              for w, s in per_call.items())
                  + (f". A straight line through {ends[0]} and {ends[1]}: {slope * 1e3:.1f} ms per token plus "
                     f"{(per_call[ends[0]] - ends[0] * slope) * 1e3:.0f} ms per call." if ends else ".")]
    lines.append("")
    text = "\n".join(lines)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(text)
    print(text)
    return text


if __name__ == "__main__":
    main()
