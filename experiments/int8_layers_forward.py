"""What the int8 layers do to an int4 GGUF target's forward: the built-in target as ``load(..., dtype="int4")``
loads it (the file's Q4_K blocks on the int4 kernel, its Q6_K tensors re-quantised to int8 per row:
``treespec.models.gguf_blocks.with_file_blocks``) against the same model with those layers in bfloat16 (each int8
layer's bfloat16 twin: the same weights, the loading before the int8 layers), one forward of 1 / 4 / 8 tokens after
128 cached tokens (``measure_latency``), ``--rounds`` rounds alternating the two. Also checks that the int8 kernel
computes each row on its own: every int8 layer's product of 8 random rows equals the rows one at a time, bit for bit.

Run at e06dd7a (with this script) on the Zen 4 host (family 25 model 17), alone, 3 rounds, 1 min 17 s: ms at
1 / 4 / 8 tokens, int8 layers 71.2 / 120.2 / 230.6, 80.6 / 111.7 / 222.6, 80.7 / 116.9 / 209.4; bfloat16 layers
107.4 / 127.8 / 199.9, 116.3 / 133.2 / 194.4, 118.8 / 141.6 / 218.0: a third off one token, a few percent off
four, nothing at eight (the int8 kernel's cost grows with the rows). Rows independent in all 29 int8 layers.

    python experiments/int8_layers_forward.py [--rounds 3]
"""

from __future__ import annotations

import argparse

import torch

from treespec.models import DEFAULT_TARGET, load
from treespec.models.quantized import Int8Linear, replace_layers
from treespec.models.timing import measure_latency


def rows_independent(model: torch.nn.Module) -> tuple[int, int]:
    """(int8 layers whose 8-row product equals its rows one at a time, int8 layers)."""
    layers = [m for m in model.modules() if isinstance(m, Int8Linear)]
    gen = torch.Generator().manual_seed(0)
    same = 0
    for layer in layers:
        x = torch.randn(8, layer.in_features, generator=gen)
        same += torch.equal(layer(x), torch.cat([layer(row[None]) for row in x]))
    return same, len(layers)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=3)
    args = ap.parse_args()
    torch.set_num_threads(2)
    int8, _ = load(DEFAULT_TARGET, dtype="int4", role="target", prompt_twin="twin")
    same, layers = rows_independent(int8)
    print(f"rows independent in {same} of {layers} int8 layers", flush=True)
    bf16, _ = load(DEFAULT_TARGET, dtype="int4", role="target", prompt_twin="twin")  # its int8 layers' twins below
    replace_layers(bf16, Int8Linear, lambda name, layer: layer.wide)
    for _ in range(args.rounds):
        for name, model in (("int8 layers", int8), ("bfloat16 layers", bf16)):
            ms = {n: 1e3 * t for n, t in measure_latency(model, (1, 4, 8), context=128, repeats=5).items()}
            print(f"{name}: " + " / ".join(f"{v:.1f}" for v in ms.values()) + " ms at 1 / 4 / 8 tokens", flush=True)


if __name__ == "__main__":
    main()
