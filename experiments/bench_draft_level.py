"""One draft level per draft precision, how often each precision's guess is the target's, and one attention call.

The captured step drafts with compiled forwards, so the draft's precision must be one
``torch.compile`` can trace: ``torch.ao``'s int8 is not, ``bfloat16`` and ``int4``
(``treespec.models.quantized``) are. Four tables:

1. **Draft level**: one forward of the real 0.5B draft (Qwen2.5-Coder) over ``w`` tree tokens after
   a 200-token context, milliseconds (median of 20 calls after 3 warm-ups), for the eager step's
   forward (``eager-*``: the growable cache) and the captured step's (``compiled-*``: static
   cache of 1024 rows, inductor with weight freezing); ``int4-gN`` is int4 with N columns per scale.
   Both run the model through ``treespec.core.attention.tree_forward`` (grouped-query SDPA).
2. **Agreement**: how often the draft's argmax equals the target's (1.5B, bfloat16) on text the
   target reads with teacher forcing: HumanEval 0-15 prompts with their canonical solutions (code)
   and Lee news articles 200-207 (prose), positions after each prompt. This is the acceptance rate
   of a one-token chain at T=0, the figure quantisation moves; both sets are disjoint from the
   benchmarks' evaluation prompts (HumanEval 100+, Lee news 0-9).
3. **Linear kernels**: the draft's Linear layers alone (24 layers' projections and the LM head, each
   with its own weights, so they stream from memory as in a forward), milliseconds per forward over
   1, 4 and 64 rows, per kernel: ``torch.ao`` int8 (fbgemm), torch's int4 kernel (``int4`` with 128
   columns per scale, as ``treespec.models.quantized`` packs it) and bfloat16 ``F.linear``; eager.
4. **Attention**: one attention call as in the draft (14 query heads over 2 key/value heads, head
   dimension 64) over 1024 cached rows, microseconds, HF's ``sdpa`` path with the key/value heads
   copied (what it runs under ``torch.compile`` given a 4D mask) against ``grouped_sdpa``.

    python experiments/bench_draft_level.py --out experiments/results/draft-level-cpu.md
"""

from __future__ import annotations

import argparse
import copy
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from a checkout without installing

from treespec.bench.datasets import _lee_articles, humaneval_tasks  # noqa: E402
from treespec.common.machine import machine  # noqa: E402
from treespec.core.attention import grouped_sdpa  # noqa: E402
from treespec.core.kv import TreeCache, causal_allowed, forward_masked  # noqa: E402
from treespec.core.static_cache import StaticTreeCache  # noqa: E402
from treespec.models import DEFAULT_DRAFT, DEFAULT_TARGET, load  # noqa: E402
from treespec.models.quantized import quantize_int4  # noqa: E402
from treespec.models.precision import to_precision  # noqa: E402

CONTEXT = 200
LEVELS = ("eager-int8", "eager-int4-g64", "compiled-bfloat16", "compiled-int4-g32", "compiled-int4-g64",
          "compiled-int4-g128")
AGREEMENT = ("float32", "bfloat16", "int8", "int4-g32", "int4-g64", "int4-g128")


#: torchao's quantisations (``--levels compiled-torchao-...``; torchao is not a dependency: ``pip install torchao``).
#: Its int4 weight-only config is not among them: torchao 0.18 packs int4 for CUDA, XPU and NPU kernels only
#: (no CPU packing format); on a CPU ``int4-gN`` runs torch's own CPU int4 kernel (``treespec.models.quantized``).
TORCHAO = ("torchao-int8wo", "torchao-int8da")


def _torchao(model: torch.nn.Module, precision: str) -> torch.nn.Module:
    """``model`` in bfloat16, quantised in place by torchao: int8 weights (``int8wo``), or int8 weights and
    per-token int8 activations (``int8da``)."""
    try:
        from torchao.quantization import Int8DynamicActivationInt8WeightConfig, Int8WeightOnlyConfig, quantize_
    except ImportError as error:
        raise SystemExit(f"{precision} needs torchao ({error}); install it with `pip install torchao`") from None
    model = model.to(torch.bfloat16)
    quantize_(model,
              Int8WeightOnlyConfig() if precision == "torchao-int8wo" else Int8DynamicActivationInt8WeightConfig())
    return model


def convert(base: torch.nn.Module, precision: str) -> torch.nn.Module:
    """A copy of the float32 draft in ``precision`` (``int4-gN``: int4 with group size N; ``torchao-*``:
    :data:`TORCHAO`)."""
    model = copy.deepcopy(base)
    if precision.startswith("int4-g"):
        return quantize_int4(model, int(precision.removeprefix("int4-g")))
    if precision in TORCHAO:
        return _torchao(model, precision)
    return to_precision(model, precision)


def level_timer(draft: torch.nn.Module, compiled: bool):
    """``time(w) -> (median seconds per forward, seconds of the first call)``."""
    context = torch.arange(100, 100 + CONTEXT)
    if not compiled:
        cache = TreeCache()
        with torch.inference_mode():
            forward_masked(draft, cache, context, torch.arange(CONTEXT), causal_allowed(0, CONTEXT))

        def call(ids, pos, w):
            forward_masked(draft, cache, ids, pos, torch.ones(w, CONTEXT + w, dtype=torch.bool)).argmax(-1)
            cache.keep(CONTEXT, [])
    else:
        static = StaticTreeCache(draft, 1024)
        static.prefill(draft, context.tolist() + [0])
        step = torch.compile(lambda ids, pos, block, committed: static.forward(
            draft, ids, pos, block, committed, committed + 2).argmax(-1), fullgraph=True)

        def call(ids, pos, w):
            step(ids, pos, torch.ones(w, 8, dtype=torch.bool), static.length + 0)

    def time_it(w: int, repeats: int = 20) -> tuple[float, float]:
        ids, pos = torch.arange(w) + 5, torch.full((w,), CONTEXT)
        with torch.inference_mode():
            t = time.perf_counter()
            call(ids, pos, w)
            first = time.perf_counter() - t
            for _ in range(3):
                call(ids, pos, w)
            times = []
            for _ in range(repeats):
                t = time.perf_counter()
                call(ids, pos, w)
                times.append(time.perf_counter() - t)
        return statistics.median(times), first

    return time_it


def agreement_texts(tokenizer) -> dict[str, list[tuple[list[int], list[int]]]]:
    """``{set: [(prompt ids, continuation ids)]}``, continuations cut at 96 tokens."""
    code = [(t["prompt"], t["canonical_solution"]) for t in humaneval_tasks(0, 16)]
    prose = [(a[: len(a) // 3], a[len(a) // 3:]) for a in _lee_articles()[200:208]]
    ids = lambda text: tokenizer(text)["input_ids"]  # noqa: E731
    return {name: [(ids(p), ids(c)[:96]) for p, c in pairs] for name, pairs in (("code", code), ("prose", prose))}


def kernel_table(rows: tuple[int, ...] = (1, 4, 64)) -> list[str]:
    from treespec.models.quantized import Int4Linear, quantize_int8

    shapes = [(896, 896), (128, 896), (128, 896), (896, 896), (4864, 896), (4864, 896), (896, 4864)]
    lines = ["| kernel | " + " | ".join(f"{r} rows" for r in rows) + " |", "|---|" + "---|" * len(rows)]
    torch.manual_seed(0)
    for kernel in ("int8-fbgemm", "int4-g128", "bfloat16"):
        def make(n: int, k: int):
            linear = torch.nn.Linear(k, n, bias=False)
            if kernel == "int8-fbgemm":
                return quantize_int8(torch.nn.Sequential(linear))[0]
            if kernel == "int4-g128":
                layer = Int4Linear.from_linear(linear, 128)
                layer.__dict__["wide"] = None  # the int4 kernel at every width
                return layer
            return linear.to(torch.bfloat16)

        layers = [make(n, k) for _ in range(24) for n, k in shapes] + [make(151936, 896)]
        cells = []
        for r in rows:
            x = {896: torch.randn(r, 896), 4864: torch.randn(r, 4864)}
            if kernel == "bfloat16":
                x = {k: v.bfloat16() for k, v in x.items()}
            with torch.inference_mode():
                def forward():
                    for layer in layers:  # noqa: F821
                        layer(x[layer.in_features])
                forward()
                times = []
                for _ in range(5):
                    t = time.perf_counter()
                    forward()
                    times.append(time.perf_counter() - t)
            cells.append(f"{statistics.median(times) * 1e3:.1f} ms")
        lines.append(f"| {kernel} | " + " | ".join(cells) + " |")
        print(lines[-1], flush=True)
        del layers
    return lines


def attention_table() -> list[str]:
    from transformers.integrations.sdpa_attention import repeat_kv

    class Module(torch.nn.Module):
        num_key_value_groups, is_causal = 7, True

    lines = ["| dtype | queries | HF sdpa, heads copied | grouped | eager HF sdpa, heads copied | eager grouped |",
             "|---|---|---|---|---|---|"]
    for dtype in (torch.float32, torch.bfloat16):
        for q in (1, 8):
            query = torch.randn(1, 14, q, 64, dtype=dtype)
            key, value = torch.randn(1, 2, 1024, 64, dtype=dtype), torch.randn(1, 2, 1024, 64, dtype=dtype)
            mask = torch.zeros(1, 1, q, 1024, dtype=dtype)
            mask[..., 300:] = torch.finfo(dtype).min
            copied = lambda qu, k, v, m: torch.nn.functional.scaled_dot_product_attention(  # noqa: E731
                qu, repeat_kv(k, 7), repeat_kv(v, 7), attn_mask=m)
            grouped = lambda qu, k, v, m: grouped_sdpa(Module(), qu, k, v, m)[0]  # noqa: E731
            cells = []
            for fn in (torch.compile(copied, fullgraph=True), torch.compile(grouped, fullgraph=True), copied, grouped):
                for _ in range(5):
                    fn(query, key, value, mask)
                t = time.perf_counter()
                for _ in range(200):
                    fn(query, key, value, mask)
                cells.append(f"{(time.perf_counter() - t) / 200 * 1e6:.0f} us")
            lines.append(f"| {str(dtype).removeprefix('torch.')} | {q} | " + " | ".join(cells) + " |")
            print(lines[-1], flush=True)
    return lines


def main(argv: list[str] | None = None) -> str:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", type=Path, default=None, help="write the tables here (markdown)")
    ap.add_argument("--widths", default="1,4")
    ap.add_argument("--skip", default="", help="comma-separated tables to skip: levels, agreement, kernels, attention")
    ap.add_argument("--levels", default=",".join(LEVELS),
                    help="comma-separated draft variants of the level table, HOW-PRECISION with HOW eager or compiled "
                         f"(default: %(default)s); torchao's: compiled-{', compiled-'.join(TORCHAO)}")
    ap.add_argument("--agreement", default=",".join(AGREEMENT),
                    help="comma-separated precisions of the agreement table (default: %(default)s; torchao's too)")
    args = ap.parse_args(argv)
    skip = set(filter(None, args.skip.split(",")))
    torch._inductor.config.freezing = True
    widths = [int(w) for w in args.widths.split(",")]
    command = " ".join(["python experiments/bench_draft_level.py", *(argv if argv is not None else sys.argv[1:])])
    lines = [f"# Draft level, agreement and attention per draft precision ({machine('cpu')}, "
             f"torch {torch.__version__})",
             "", f"Command: `{command}`", ""]
    base, tokenizer = load(DEFAULT_DRAFT, dtype="float32", role="draft")
    if "levels" not in skip:
        lines += ["## One draft level", "",
                  f"Qwen2.5-Coder 0.5B draft, {CONTEXT}-token context, milliseconds per forward over w tree tokens "
                  "(median of 20 calls after 3 warm-ups; compiled: static cache, inductor with weight freezing; "
                  "first call = compile).", "",
                  "| draft | " + " | ".join(f"w={w}" for w in widths) + " | first call |",
                  "|---|" + "---|" * (len(widths) + 1)]
        for variant in filter(None, args.levels.split(",")):
            how, precision = variant.split("-", 1)
            if how not in ("eager", "compiled"):
                ap.error(f"--levels: {variant!r} should start with eager- or compiled-")
            time_it = level_timer(convert(base, precision), how == "compiled")
            results = [time_it(w) for w in widths]
            lines.append(f"| {variant} | " + " | ".join(f"{s * 1e3:.1f} ms" for s, _ in results)
                         + f" | {sum(f for _, f in results):.0f} s |")
            print(lines[-1], flush=True)
            torch._dynamo.reset()
    if "agreement" not in skip:
        target, _ = load(DEFAULT_TARGET, dtype="bfloat16", role="target")
        texts = agreement_texts(tokenizer)
        with torch.inference_mode():
            wanted = {name: [target(torch.tensor([p + c])).logits[0, len(p) - 1: -1].argmax(-1) for p, c in pairs]
                      for name, pairs in texts.items()}
        del target
        lines += ["", "## Agreement with the target", "",
                  "Share of positions where the draft's argmax is the target's (bfloat16) argmax, teacher-forced: "
                  + ", ".join(f"{name} {sum(len(c) for _, c in pairs)} positions" for name, pairs in texts.items())
                  + ".", "", "| draft | " + " | ".join(texts) + " |", "|---|" + "---|" * len(texts)]
        for precision in filter(None, args.agreement.split(",")):
            draft = convert(base, precision)
            cells = []
            with torch.inference_mode():
                for name, pairs in texts.items():
                    hits = sum(int((draft(torch.tensor([p + c])).logits[0, len(p) - 1: -1].argmax(-1) == want).sum())
                               for (p, c), want in zip(pairs, wanted[name]))
                    cells.append(f"{hits / sum(len(c) for _, c in pairs):.3f}")
            lines.append(f"| {precision} | " + " | ".join(cells) + " |")
            print(lines[-1], flush=True)
    if "kernels" not in skip:
        lines += ["", "## Linear kernels", "",
                  "The 0.5B draft's Linear layers alone (24 layers + the LM head, each with its own weights), "
                  "milliseconds per forward (median of 5), eager.", ""]
        lines += kernel_table()
    if "attention" not in skip:
        lines += ["", "## One attention call", "",
                  "14 query heads over 2 key/value heads, head dimension 64, 1024 cached rows (700 masked), "
                  "microseconds per call (200 calls); compiled with inductor unless marked eager.", ""]
        lines += attention_table()
    text = "\n".join(lines) + "\n"
    print(text)
    if args.out is not None:
        args.out.write_text(text)
    return text


if __name__ == "__main__":
    main()
