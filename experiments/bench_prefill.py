"""The compiled steps' prompt prefill on this CPU: fixed 64-token chunks against exact pieces.

The target (Qwen2.5-Coder 1.5B, bfloat16, inductor with weight freezing, as ``treespec generate
--compile`` runs it) caches each benchmark prompt through ``treespec.core.prefill.ChunkedPrefill``
in both cuttings, interleaved per prompt, best of ``--repeats``:

* ``chunks-64``: one static graph of 64 tokens, the last chunk padded (what CUDA graphs need);
* ``exact``: one graph with a dynamic token count, the prompt in as few near-equal pieces of at most
  512 tokens as fit, no padding (what every other backend runs).

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

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from a checkout without installing

from treespec.bench.datasets import dataset_prompts  # noqa: E402
from treespec.common.machine import machine  # noqa: E402
from treespec.core.compiling import allow_recompiles  # noqa: E402
from treespec.core.static_cache import StaticTreeCache  # noqa: E402
from treespec.core.prefill import ChunkedPrefill, padded_length, pieces  # noqa: E402
from treespec.models.loading import load  # noqa: E402
from treespec.models.packaged import DEFAULT_TARGET  # noqa: E402

SETS = (("humaneval", range(100, 110)), ("lee-news", range(0, 10)))


def best_of(fill: ChunkedPrefill, prompt: list[int], repeats: int) -> float:
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
    args = ap.parse_args(argv)
    allow_recompiles()
    torch.set_grad_enabled(False)
    target, tok = load(DEFAULT_TARGET, dtype="bfloat16", role="target")
    cache = StaticTreeCache(target, 1024)
    with torch._inductor.config.patch(freezing=True):
        fills = {"chunks-64": ChunkedPrefill(target, cache, "inductor", None, chunk=64, fixed=True),
                 "exact": ChunkedPrefill(target, cache, "inductor", None)}
        compile_s = {}
        for name, fill in fills.items():
            t = time.perf_counter()
            fill(list(range(1000, 1000 + 71)))  # compiles
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
        for width in (16, 64, 256):
            fill = ChunkedPrefill(target, cache, "inductor", None, chunk=width, fixed=True)
            prompt = list(range(1000, 1000 + width + 1))
            fill(prompt)  # compiles
            per_call[width] = statistics.median(best_of(fill, prompt, 1) for _ in range(3))
            del fill
    slope = (per_call[256] - per_call[16]) / 240  # seconds per token
    lines = [f"# Compiled prefill: fixed 64-token chunks against exact pieces ({machine('cpu')}, "
             f"torch {torch.__version__})",
             "", f"Command: `python experiments/bench_prefill.py --out {args.out}`. Target {DEFAULT_TARGET}, bfloat16, "
             f"inductor with weight freezing; seconds to cache each prompt (best of {args.repeats}, "
             "cuttings interleaved "
             f"per prompt). Compile (first call): " + ", ".join(f"{k} {v:.0f} s" for k, v in compile_s.items()) + ".",
             "", "| set | prompt | tokens cached | 64-token chunks | exact pieces | chunks-64 s | exact s | "
             "exact / chunks |",
             "|---|---|---|---|---|---|---|---|"]
    for dataset, i, n, chunks, k, secs in rows:
        lines.append(f"| {dataset} | {i} | {n} | {chunks} | {k} | {secs['chunks-64']:.3f} | {secs['exact']:.3f} | "
                     f"{secs['exact'] / secs['chunks-64']:.2f} |")
    lines += ["", "| set | chunks-64 s (sum) | exact s (sum) | exact / chunks |", "|---|---|---|---|"]
    for dataset, _ in SETS:
        a, b = sums["chunks-64"][dataset], sums["exact"][dataset]
        lines.append(f"| {dataset} | {a:.2f} | {b:.2f} | {b / a:.2f} |")
    lines += ["", "One static graph per width, seconds per call (median of 3): "
              + ", ".join(f"{w} tokens {s * 1e3:.0f} ms ({s / w * 1e3:.1f} ms per token)" for w, s in per_call.items())
              + f". A straight line through 16 and 256: {slope * 1e3:.1f} ms per token plus "
              f"{(per_call[16] - 16 * slope) * 1e3:.0f} ms per call.", ""]
    text = "\n".join(lines)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(text)
    print(text)
    return text


if __name__ == "__main__":
    main()
