"""A check of ``treespec.core.fused_qkv`` on a CPU: attention's three biased products (q, k, v) of a frozen Qwen2
layer of the 0.5B draft's sizes become one, and the layer's logits stay eager's.

Inductor's own freezing pass for such triples wants weights of one shape on torch 2.11; under grouped-query
attention q is wider than k and v, so on the GPU image's torch 2.11 q, k and v stayed three products per layer
(``experiments/results/gpu-h200-levers``), and the frozen layer below keeps three on torch 2.13 too, until
treespec's own rewrite (``fused_qkv``; on an H200: ``experiments/results/gpu-h200-qkv``).

    python experiments/concat_linears.py     # q, k, v as one product, the layer's output unchanged
"""

from __future__ import annotations

import argparse
import contextlib
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # runs from a checkout without installing treespec

from treespec.core import fused_qkv  # noqa: E402


def main() -> None:
    """A Qwen2 layer of the draft's sizes (grouped-query attention), frozen, without and with the rewrite: the
    products in inductor's code, and the logits against eager's."""
    argparse.ArgumentParser(description=__doc__.splitlines()[0]).parse_args()  # no options: --help says what it does
    from torch._inductor.utils import run_and_get_code
    from transformers import Qwen2Config, Qwen2ForCausalLM

    cfg = Qwen2Config(hidden_size=896, num_hidden_layers=1, num_attention_heads=14, num_key_value_heads=2,
                      intermediate_size=4864, vocab_size=256)
    model = Qwen2ForCausalLM(cfg).eval()
    ids = torch.arange(4)[None]
    # on a CPU oneDNN's weight packing takes each product first: off, as on CUDA
    settings = {"freezing": True, "cpp.weight_prepack": False}
    with torch.inference_mode(), torch._inductor.config.patch(settings):
        want = model(ids).logits
        for on in (False, True):
            torch._dynamo.reset()
            with fused_qkv.applied() if on else contextlib.nullcontext(), fused_qkv.uncached():
                got, (code,) = run_and_get_code(torch.compile(lambda x: model(x).logits), ids)
            print(f"rewrite {'on ' if on else 'off'}: {code.count('extern_kernels.addmm(')} biased products, "
                  f"{code.count('extern_kernels.mm(')} others; max |logit difference| from eager "
                  f"{float((got - want).abs().max()):.1e}")


if __name__ == "__main__":
    main()
