"""One draft level of the captured step, per draft precision: eager int8 against compiled precisions.

The captured step drafts with compiled forwards, so the draft's precision must be one
``torch.compile`` can trace. This times one draft forward of the real 0.5B draft (Qwen2.5-Coder)
over ``w`` tree tokens after a 200-token context, on its static cache, for:

* ``eager-int8``: what the eager step uses on this CPU (``torch.ao`` dynamic int8, fbgemm kernels;
  its packed weights cannot be traced by ``torch.compile``), on the growable cache;
* ``bfloat16``: compiled with inductor weight freezing (oneDNN prepacked bf16 weights);
* ``torchao-int8-weight-only`` and ``torchao-int8-dynamic``: ``torchao`` int8 under the same
  compile (skipped when ``torchao`` is not installed: ``pip install torchao``).

    python experiments/bench_draft_level.py --out experiments/results/draft-level-cpu.md
"""

from __future__ import annotations

import argparse
import importlib.util
import time
from pathlib import Path

import torch

from treespec.common.machine import machine
from treespec.core.kv import StaticTreeCache, TreeCache, causal_allowed, forward_masked
from treespec.models import DEFAULT_DRAFT, load

CONTEXT = 200
VARIANTS = ("eager-int8", "bfloat16", "torchao-int8-weight-only", "torchao-int8-dynamic")


def level_timer(variant: str):
    """``time(w) -> (seconds per forward, seconds of the first call)`` for one variant."""
    draft, _ = load(DEFAULT_DRAFT, dtype="int8" if variant == "eager-int8" else "bfloat16", role="draft")
    if variant.startswith("torchao"):
        from torchao.quantization import Int8DynamicActivationInt8WeightConfig, Int8WeightOnlyConfig, quantize_

        quantize_(draft, Int8WeightOnlyConfig() if variant.endswith("weight-only")
                  else Int8DynamicActivationInt8WeightConfig())
    context = torch.arange(100, 100 + CONTEXT)
    if variant == "eager-int8":
        cache = TreeCache()
        with torch.inference_mode():
            forward_masked(draft, cache, context, torch.arange(CONTEXT), causal_allowed(0, CONTEXT))

        def call(ids, pos, w):
            forward_masked(draft, cache, ids, pos, torch.ones(w, CONTEXT + w, dtype=torch.bool)).argmax(-1)
            cache.keep(CONTEXT, [])
    else:
        static = StaticTreeCache(draft, 1024)
        static.prefill(draft, context.tolist() + [0])
        compiled = torch.compile(lambda ids, pos, block, committed: static.forward(
            draft, ids, pos, block, committed, committed + 2).argmax(-1), fullgraph=True)

        def call(ids, pos, w):
            compiled(ids, pos, torch.ones(w, 8, dtype=torch.bool), static.length + 0)

    def time_it(w: int, repeats: int = 20) -> tuple[float, float]:
        ids, pos = torch.arange(w) + 5, torch.full((w,), CONTEXT)
        with torch.inference_mode():
            t = time.perf_counter()
            call(ids, pos, w)
            first = time.perf_counter() - t
            for _ in range(3):
                call(ids, pos, w)
            t = time.perf_counter()
            for _ in range(repeats):
                call(ids, pos, w)
        return (time.perf_counter() - t) / repeats, first

    return time_it


def main(argv: list[str] | None = None) -> str:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", type=Path, default=None, help="write the table here (markdown)")
    ap.add_argument("--widths", default="1,4")
    args = ap.parse_args(argv)
    torch._inductor.config.freezing = True
    widths = [int(w) for w in args.widths.split(",")]
    lines = [f"# One draft level per draft precision ({machine('cpu')}, torch {torch.__version__})", "",
             f"Qwen2.5-Coder 0.5B draft, {CONTEXT}-token context, milliseconds per forward over w tree tokens "
             "(20 calls after 3 warm-ups; compiled variants with inductor weight freezing, first call = compile).",
             "", "| draft | " + " | ".join(f"w={w}" for w in widths) + " | first call (compile) |",
             "|---|" + "---|" * (len(widths) + 1)]
    for variant in VARIANTS:
        if variant.startswith("torchao") and importlib.util.find_spec("torchao") is None:
            lines.append(f"| {variant} | " + " | ".join("not installed" for _ in widths) + " | - |")
            continue
        time_it = level_timer(variant)
        results = [time_it(w) for w in widths]
        lines.append(f"| {variant} | " + " | ".join(f"{s * 1e3:.1f} ms" for s, _ in results)
                     + f" | {sum(f for _, f in results):.0f} s |")
        print(lines[-1], flush=True)
    text = "\n".join(lines) + "\n"
    print(text)
    if args.out is not None:
        args.out.write_text(text)
    return text


if __name__ == "__main__":
    main()
