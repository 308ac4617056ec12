"""What one forward of a model's Linear layers costs on this CPU's kernels, by the rows multiplied (tokens of a tree).

Every Linear of the built-in 1.5B target's decoder layers (its config's shapes: q, k, v, o, gate, up, down, times
its layer count; random weights, no checkpoint needed), run as one set at M rows, in milliseconds (the median of
``--repeats`` after two warm-ups, 2 threads):

* ``bfloat16``: ``torch.nn.functional.linear`` on bfloat16 weights (oneDNN);
* ``int4``: ``torch.ops.aten._weight_int4pack_mm_for_cpu`` with groups of 32 (the GGUF blocks' map, the int4 target's
  kernel, ``treespec.models.quantized``);
* ``int8 weights``: ``aten._weight_int8pack_mm`` (per-channel int8 weights, bfloat16 activations);
* ``int8 x int8``: per-row int8 activations times per-channel int8 weights through ``torch._int_mm`` (its CPU path
  takes 17 rows or more: fewer are padded), the arithmetic llama.cpp's CPU kernels do on its blocks;
* ``int8 dynamic``: ``torch.ao``'s dynamic int8 Linear (fbgemm, per-channel int8 weights, float32 in and out; the
  ``int8`` draft precision): one activation scale for the whole input, so a row's result depends on the other
  rows multiplied with it (no kernel for an exact target's tree).

Run at 3f4fd20 on the Zen 4 host (family 25 model 17), alone (7 s): M = 1 / 4 / 9 / 16 rows, ms: bfloat16 138.0 /
155.1 / 183.7 / 215.2; **int4 37.0 / 66.2 / 192.7 / 255.4**; int8 weights 68.3 / 106.9 / 268.8 / 351.5; int8 x int8
137.3 / 134.0 / 139.7 / 165.3 (a one-off of the same code an hour before: bfloat16 191.8 at one row, the rest within
a few percent). At one row the int4 kernel streams its 0.66 GB at the memory's speed; past it, it is compute-bound
(about 64 ms per four rows): why an int4 target's tree stays small here and its prompt runs on bfloat16 twins.

Again at f58e3b7 with ``int8 dynamic`` added (same host, alone, 9 s): bfloat16 132.4 / 152.5 / 184.1 / 197.6; int4
39.0 / 67.1 / 190.4 / 253.6; int8 weights 79.5 / 104.0 / 250.8 / 334.8; int8 x int8 130.6 / 141.2 / 133.1 / 140.6;
**int8 dynamic 38.8 / 50.2 / 52.7 / 104.7**: fbgemm's VNNI int8 product stays at the memory's speed up to 9 rows,
3.6x the int4 kernel there, but its one activation scale per input makes a tree's rows depend on each other.

    python experiments/linear_kernels_by_rows.py [--rows 1 4 9 16]
"""

from __future__ import annotations

import argparse
import statistics
import time
from typing import Callable

import torch
from transformers import AutoConfig

from treespec.models import cache_root
from treespec.models.loading import DEFAULT_TARGET, load
from treespec.models.quantized import quantize_int8


def shapes(config) -> list[tuple[int, int]]:
    """(out, in) of one decoder layer's Linear layers."""
    h, kv = config.hidden_size, config.num_key_value_heads * (config.hidden_size // config.num_attention_heads)
    return [(h, h), (kv, h), (kv, h), (h, h), (config.intermediate_size, h), (config.intermediate_size, h),
            (h, config.intermediate_size)]


def median_ms(fn: Callable[[], None], repeats: int) -> float:
    fn(), fn()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return 1e3 * statistics.median(times)


def int4(w: torch.Tensor, group: int = 32) -> tuple[torch.Tensor, torch.Tensor]:
    n, k = w.shape
    g = w.reshape(n, k // group, group)
    low, high = g.amin(-1, keepdim=True), g.amax(-1, keepdim=True)
    scale = ((high - low) / 15).clamp(min=1e-6)
    codes = ((g - low) / scale).round().clamp(0, 15).to(torch.int32).reshape(n, k)
    packed = torch.ops.aten._convert_weight_to_int4pack_for_cpu(codes, 1)
    zero = low + 8 * scale
    return packed, torch.stack([scale.reshape(n, -1), zero.reshape(n, -1)], -1).transpose(0, 1).contiguous().bfloat16()


def linear_of(w: torch.Tensor) -> torch.nn.Linear:
    linear = torch.nn.Linear(w.shape[1], w.shape[0], bias=False)
    linear.weight.data = w
    return linear


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rows", type=int, nargs="+", default=[1, 4, 9, 16])
    ap.add_argument("--repeats", type=int, default=5)
    args = ap.parse_args()
    torch.set_num_threads(2)
    torch.manual_seed(0)
    cached = cache_root() / DEFAULT_TARGET  # the dequantised model's folder; its config alone is read
    config = (AutoConfig.from_pretrained(cached) if (cached / "config.json").is_file()
              else load(DEFAULT_TARGET, dtype="bfloat16")[0].config)
    layer = shapes(config)
    weights = [torch.randn(n, k) * 0.02 for n, k in layer]
    bf16 = [w.bfloat16() for w in weights]
    four = [int4(w) for w in weights]
    eight = []
    for w in weights:
        s = w.abs().amax(1, keepdim=True) / 127
        eight.append(((w / s).round().clamp(-127, 127).to(torch.int8), s.squeeze(1)))
    dynamic = [quantize_int8(torch.nn.Sequential(linear_of(w)))[0] for w in weights]
    layers = config.num_hidden_layers
    for m in args.rows:
        x = {k: torch.randn(m, k).bfloat16() for k in {k for _, k in layer}}

        def run_bf16():
            for w in bf16:
                torch.nn.functional.linear(x[w.shape[1]], w)

        def run_int4():
            for (packed, sz), (_, k) in zip(four, layer):
                torch.ops.aten._weight_int4pack_mm_for_cpu(x[k], packed, 32, sz)

        def run_int8_weights():
            for (q, s), (_, k) in zip(eight, layer):
                torch.ops.aten._weight_int8pack_mm(x[k], q, s.bfloat16())

        def run_int8_int8():
            for (q, _), (_, k) in zip(eight, layer):
                a = x[k].float()
                qa = (a / (a.abs().amax(1, keepdim=True) / 127)).round().to(torch.int8)
                torch._int_mm(torch.nn.functional.pad(qa, (0, 0, 0, max(0, 17 - m))), q.t())

        def run_int8_dynamic():
            for layer_q, (_, k) in zip(dynamic, layer):
                layer_q(x[k].float())

        row = {name: layers * median_ms(fn, args.repeats) for name, fn in
               [("bfloat16", run_bf16), ("int4", run_int4), ("int8 weights", run_int8_weights),
                ("int8 x int8", run_int8_int8), ("int8 dynamic", run_int8_dynamic)]}
        print(f"M={m}: " + ", ".join(f"{k} {v:.1f} ms" for k, v in row.items()), flush=True)


if __name__ == "__main__":
    main()
