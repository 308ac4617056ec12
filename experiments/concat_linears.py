"""A freezing rewrite for phase levels of ``bench_gpu.py``: three biased linears that share an input (attention's
q, k and v) computed as one matrix product, whatever their output widths.

Inductor's freezing already rewrites such triples into one product of concatenated weights, but up to torch
2.11 only when the three weights have the same shape (its ``check_concat_weights``; torch 2.13 compares the
input dimension alone). Under grouped-query attention q is wider than k and v (896 against 128 columns in the
0.5B draft), so on the GPU image's torch 2.11 q, k and v stayed three products per layer
(``experiments/results/gpu-h200-levers``). :func:`register` adds the same rewrite with the input-dimension
check as a freezing pass of its own; it applies only inside :func:`enabled` (a lever of ``bench_gpu.py``).

    python experiments/concat_linears.py     # CPU check: q, k, v as one product, the layer's output unchanged
"""

from __future__ import annotations

import contextlib
import functools

import torch
from torch._inductor.fx_passes import freezing_patterns
from torch._inductor.pattern_matcher import Match, fwd_only, register_replacement

aten = torch.ops.aten

#: whether the rewrite applies (registered patterns stay for the process; this switches ours)
ENABLED = [False]


def _three_products(inp, w1, w2, w3, b1, b2, b3):
    return aten.addmm(b1, inp, w1), aten.addmm(b2, inp, w2), aten.addmm(b3, inp, w3)


def _one_product(inp, w1, w2, w3, b1, b2, b3):
    widths = [w1.size(1), w2.size(1), w3.size(1)]
    return aten.addmm(torch.cat((b1, b2, b3)), inp, torch.cat((w1, w2, w3), dim=1)).split(widths, dim=1)


def _frozen_weights_of_one_input_width(match: Match) -> bool:
    """The weights and biases are frozen constants, the weights take inputs of one width, the biases are vectors."""
    weights = [match.kwargs[k] for k in ("w1", "w2", "w3")]
    biases = [match.kwargs[k] for k in ("b1", "b2", "b3")]
    return (ENABLED[0] and all(n.op == "get_attr" for n in weights + biases)
            and len({w.meta["val"].shape[0] for w in weights}) == 1 and all(b.meta["val"].dim() == 1 for b in biases))


@functools.cache
def register() -> None:
    """Add the rewrite to inductor's freezing passes (once per process), as a pass of its own after inductor's
    (a pattern matcher refuses a pattern its pass already holds, and inductor's holds this one with the stricter
    check)."""
    from torch._inductor.pattern_matcher import PatternMatcherPass

    freezing_patterns.lazy_init()
    own = PatternMatcherPass()
    example = [torch.empty(8, 8) for _ in range(7)]  # inductor traces its own patterns from 2-D examples alike
    register_replacement(_three_products, _one_product, example, fwd_only, own,
                         extra_check=_frozen_weights_of_one_input_width,
                         exclusive_arg_names=("w1", "w2", "w3", "b1", "b2", "b3"))
    freezing_patterns.pass_patterns.append(own)


@contextlib.contextmanager
def enabled():
    """The rewrite on (registered at first use), with inductor's and AOT's compile caches off: their keys do not
    hold :data:`ENABLED`, so a graph compiled without the rewrite would be served again with it."""
    register()
    with torch._inductor.config.patch(fx_graph_cache=False), \
            torch._functorch.config.patch(enable_autograd_cache=False):
        ENABLED[0] = True
        try:
            yield
        finally:
            ENABLED[0] = False


def main() -> None:
    """A Qwen2 layer of the draft's sizes (grouped-query attention), frozen, without and with the rewrite: the
    products in inductor's code, and the logits against eager's."""
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
            with enabled() if on else contextlib.nullcontext():
                got, (code,) = run_and_get_code(torch.compile(lambda x: model(x).logits), ids)
            print(f"rewrite {'on ' if on else 'off'}: {code.count('extern_kernels.addmm(')} biased products, "
                  f"{code.count('extern_kernels.mm(')} others; max |logit difference| from eager "
                  f"{float((got - want).abs().max()):.1e}")


if __name__ == "__main__":
    main()
