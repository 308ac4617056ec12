"""Kernels per draft layer in inductor's generated code: where a captured draft level's launches come from.

On a GPU a draft level is launch-bound: the 0.5B draft's level costs 2.3 ms where its weights stream in
about 0.2 ms (issue 40), so the number of kernels per layer sets its cost. The count does not need a GPU:
inductor's generated code for a CPU lists every kernel it calls (its fused C++ kernels and the external
calls for matmuls and attention), and the same graph lowers to about as many Triton kernels and cuBLAS
calls on CUDA (pointwise fusion is the same pass). This script compiles the captured step's draft level
(a forward of ``--rows`` rows on a static cache after a context, then the top-8 choices of each row) for a
Qwen2 model of the real 0.5B draft's layer sizes with 1 and with 2 layers (random weights, the real
vocabulary), counts the kernels in each, and reports their difference: the kernels of one layer, and the
rest (embedding, mask, final norm, LM head, top-k), under each of ``CONFIGS``: inductor without and with weight
freezing (the CPU default of ``compile=True``; it folds constant work and prepacks weights), and freezing with
the linears that share an input concatenated (q, k, v; gate, up), which freezing does by default on CUDA. Under
that last configuration also each tree attention of ``ATTENTIONS`` (``--attention``): SDPA's own kernel, SDPA's
math path (the ``default+math`` lever of ``bench_gpu.py``), and the attention written out
(``attention.grouped_matmul``, the ``default+matmul`` lever). With ``--split-k``, the attention written out with
and without the down projection (and o, and q/k/v's one product) as split-K sums (``gpu_protocol.split_k``, the
``default+matmul+split-k`` levers; each report says how many products the pass rewrote per layer: none where the
CPU's weight packing takes the products first, as for bfloat16 on a CPU that computes in it): whether the sum of
the pieces becomes a kernel of its own or part of the ones that read it. ``--time CALLS`` also times each compiled
level on this CPU (medians; a layer's milliseconds as the 2-layer level's less the 1-layer one's).

    python experiments/count_kernels.py --out experiments/results/kernels-per-layer-cpu.md
    python experiments/count_kernels.py --attention --out experiments/results/kernels-per-layer-attention-cpu.md
    python experiments/count_kernels.py --split-k --rows 16 --capacity 512 --time 20 \
        --out experiments/results/kernels-per-layer-split-k-cpu.md
"""

from __future__ import annotations

import argparse
import contextlib
import re
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from a checkout without installing
sys.path.insert(0, str(Path(__file__).resolve().parent))

from torch._inductor.utils import run_and_get_code  # noqa: E402
from transformers import Qwen2Config, Qwen2ForCausalLM  # noqa: E402

from gpu_protocol import split_k  # noqa: E402
from treespec.common.machine import machine  # noqa: E402
from treespec.core import attention  # noqa: E402
from treespec.core.static_cache import StaticTreeCache  # noqa: E402

DRAFT = dict(hidden_size=896, num_attention_heads=14, num_key_value_heads=2, intermediate_size=4864, vocab_size=151936,
             max_position_embeddings=32768, rms_norm_eps=1e-6, tie_word_embeddings=True,
             rope_parameters={"rope_theta": 1e6, "rope_type": "default"}, use_sliding_window=False)
#: what a kernel call looks like in inductor's generated wrapper (C++ kernels on a CPU, Triton on CUDA, and
#: the external calls: matmuls, attention, oneDNN's prepacked linears)
KERNEL = re.compile(r"^\s+(?:\w+ = )?(cpp_fused_\w+|triton_\w+\.run|extern_kernels\.\w+|torch\.ops\.\w+\.\w+"
                    r"(?:\.\w+)?|aten\.\w+(?:\.\w+)?)\(", re.M)


def kernels(code: str) -> dict[str, int]:
    """Kernel calls in the generated ``call`` function, by kind."""
    counts: dict[str, int] = {}
    for name in KERNEL.findall(code):
        kind = "fused pointwise/reduction (C++)" if name.startswith("cpp_fused") else \
            "fused pointwise/reduction (Triton)" if name.startswith("triton") else name
        counts[kind] = counts.get(kind, 0) + 1
    return counts


#: the compile configurations counted: name -> (freezing, concatenate linears sharing an input). Freezing on
#: CUDA concatenates them (q, k, v; gate, up) by default; on a CPU only with ``cpp.enable_concat_linear``
CONFIGS = {"no freezing": (False, False), "freezing": (True, False),
           "freezing with concatenated linears (as on CUDA)": (True, True)}


#: the tree attentions counted with ``--attention`` (under freezing with concatenated linears): name -> (
#: ``attention.TREE_ATTENTION``, SDPA's math path forced)
ATTENTIONS = {"SDPA's kernel": ("sdpa", False), "SDPA's math path": ("sdpa", True),
              "written out (grouped_matmul)": ("matmul", False)}
#: the split-K configurations counted with ``--split-k`` (the attention written out): name -> splits by role
SPLITS = {"no split": {}, "down projection in 8 pieces": {"down": 8},
          "down, o and q/k/v in 8 pieces each": {"down": 8, "o": 8, "qkv": 8}}


@contextlib.contextmanager
def tree_attention(name: str, math: bool):
    """``attention.TREE_ATTENTION = name`` for the block, with SDPA held to its math path if ``math``."""
    from torch.nn.attention import SDPBackend, sdpa_kernel

    saved = attention.TREE_ATTENTION
    attention.TREE_ATTENTION = name
    try:
        with sdpa_kernel(SDPBackend.MATH) if math else contextlib.nullcontext():
            yield
    finally:
        attention.TREE_ATTENTION = saved


def level_code(layers: int, rows: int, context: int, capacity: int, freezing: bool, dtype: torch.dtype,
               concat: bool = False, splits: dict[str, int] | None = None,
               calls: int = 0) -> tuple[str, float, float | None, int]:
    """The level's generated code, its compile seconds, with ``calls`` its median milliseconds over that many calls
    after a warm-up, and with ``splits`` (``{}``: none) how many products the split-K pass took."""
    torch.manual_seed(0)
    model = Qwen2ForCausalLM(Qwen2Config(num_hidden_layers=layers, attn_implementation="sdpa",
                                         **DRAFT)).to(dtype).eval()
    split = split_k.SplitK(split_k.shapes_of(model.config, splits)) if splits else None
    settings = split_k.settings(split) if split else {}
    return *_level_code(model, rows, context, capacity, freezing, concat, settings, calls), split.taken if split else 0


def _level_code(model: torch.nn.Module, rows: int, context: int, capacity: int, freezing: bool,
                concat: bool, settings: dict, calls: int) -> tuple[str, float, float | None]:
    cache = StaticTreeCache(model, capacity)
    cache.prefill(model, list(range(1, context + 2)))
    committed = cache.length.clone()
    ids = torch.arange(rows) + 5
    block = torch.ones(rows, rows, dtype=torch.bool).tril()

    def level(ids, positions, block, committed):
        return torch.topk(cache.forward(model, ids, positions, block, committed), 8, dim=-1).indices

    fn = torch.compile(level, fullgraph=True)
    t = time.perf_counter()
    # freezing must be on while dynamo traces (it marks the weights static then), not only in inductor's options
    with torch.inference_mode(), torch._inductor.config.patch(freezing=freezing, fx_graph_cache=False,
                                                              **{"cpp.enable_concat_linear": concat}, **settings):
        _, codes = run_and_get_code(fn, ids, committed + torch.arange(rows), block, committed)
        seconds = time.perf_counter() - t
        times = []
        for _ in range(calls + 1 if calls else 0):  # the first a warm-up (it writes the same cache rows each time)
            t = time.perf_counter()
            fn(ids, committed + torch.arange(rows), block, committed)
            times.append(time.perf_counter() - t)
    torch._dynamo.reset()
    return "\n".join(codes), seconds, statistics.median(times[1:]) * 1e3 if calls else None


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", type=Path, default=None, help="markdown report (default: print only)")
    ap.add_argument("--rows", type=int, default=4)
    ap.add_argument("--context", type=int, default=128)
    ap.add_argument("--capacity", type=int, default=1024)
    ap.add_argument("--dtype", default="bfloat16", choices=("bfloat16", "float32"))
    ap.add_argument("--attention", action="store_true",
                    help="count each tree attention of ATTENTIONS under freezing with concatenated linears instead")
    ap.add_argument("--split-k", action="store_true",
                    help="count each split-K configuration of SPLITS (attention written out, freezing, concatenated "
                         "linears) instead")
    ap.add_argument("--time", type=int, default=0, metavar="CALLS",
                    help="also time each compiled level: the median of CALLS calls after a warm-up, and a layer's "
                         "milliseconds as the 2-layer level's less the 1-layer one's")
    args = ap.parse_args(argv)
    dtype = getattr(torch, args.dtype)
    result: dict = {}
    if args.split_k:
        runs = {f"{name} (attention written out, freezing, concatenated linears)": (True, True, ("matmul", False),
                                                                                  splits)
                for name, splits in SPLITS.items()}
    elif args.attention:
        runs = {f"{name} (freezing, concatenated linears)": (True, True, how, None)
                for name, how in ATTENTIONS.items()}
    else:
        runs = {name: (*config, ("sdpa", False), None) for name, config in CONFIGS.items()}
    for name, (freezing, concat, how, splits) in runs.items():
        per = {}
        for layers in (1, 2):
            with tree_attention(*how):
                code, seconds, ms, taken = level_code(layers, args.rows, args.context, args.capacity, freezing,
                                                      dtype, concat, splits, args.time)
            per[layers] = {"kernels": kernels(code), "seconds": seconds, "taken": taken, "ms": ms}
        one, two = per[1]["kernels"], per[2]["kernels"]
        layer = {k: two.get(k, 0) - one.get(k, 0) for k in sorted(set(one) | set(two))}
        rest = {k: one.get(k, 0) - layer.get(k, 0) for k in one}
        result[name] = {"per_layer": {k: v for k, v in layer.items() if v},
                        "outside_layers": {k: v for k, v in rest.items() if v}, "compile_seconds": per[2]["seconds"]}
        if splits is not None:
            result[name]["split_products_per_layer"] = per[2]["taken"] - per[1]["taken"]
        if args.time:
            result[name].update(ms_one_layer=per[1]["ms"], ms_two_layers=per[2]["ms"],
                                ms_per_layer=per[2]["ms"] - per[1]["ms"])
    lines = [f"# Kernels per draft layer in inductor's generated code ({machine(torch.device('cpu'))}, torch "
             f"{torch.__version__})", "",
             f"Command: `python experiments/count_kernels.py{' --attention' if args.attention else ''}"
             f"{' --split-k' if args.split_k else ''}"
             + "".join(f" --{k} {v}" for k, v in vars(args).items()
                       if k in ("rows", "context", "capacity", "dtype", "time") and v != ap.get_default(k))
             + " --out ...` "
             f"({args.rows} rows after {args.context} cached "
             f"tokens on a {args.capacity}-row static cache, {args.dtype}, then top-8 per row; Qwen2 with the 0.5B "
             "draft's layer sizes; one layer = the 2-layer graph's kernels less the 1-layer graph's).", ""]
    for name, r in result.items():
        total = sum(r["per_layer"].values())
        lines += [f"## {name}: {total} kernels per layer", ""]
        if "split_products_per_layer" in r:
            lines += [f"Products the split-K pass rewrote per layer: {r['split_products_per_layer']}.", ""]
        if "ms_per_layer" in r:
            lines += [f"Timed (median of {args.time} calls): {r['ms_per_layer']:.2f} ms per layer (the 1-layer level "
                      f"{r['ms_one_layer']:.2f} ms, the 2-layer one {r['ms_two_layers']:.2f} ms).", ""]
        lines += ["| kernel | per layer | outside the layers |", "|---|---|---|"]
        for k in sorted(set(r["per_layer"]) | set(r["outside_layers"])):
            lines.append(f"| `{k}` | {r['per_layer'].get(k, 0)} | {r['outside_layers'].get(k, 0)} |")
        lines.append("")
    text = "\n".join(lines)
    print(text)
    if args.out:
        args.out.write_text(text)
    return result


if __name__ == "__main__":
    main()
