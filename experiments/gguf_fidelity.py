"""How faithful each precision treespec loads a GGUF target in is to the file itself.

The reference is the file's float32 dequantisation (``load(name, dtype="float32")``: every weight exactly as the
file's blocks decode). Against it, on held-out text (HumanEval problems with their canonical solutions, and
lee-news leads: text none of treespec's calibrations saw), teacher-forced: the share of positions where the
next-token argmax agrees, the mean KL divergence from the reference's next-token distribution, and each model's
perplexity on the text. Candidates: bfloat16 (the float weights rounded), ``int4`` as loaded (the file's own
4-bit blocks; its other types re-quantised to int8 per row: ``treespec.models.gguf_blocks.with_file_blocks``) twice:
on the kernels, as its decoding steps run, and on its layers' bfloat16 twins of the same weights, as its prompts run
(a teacher-forced text is one wide input: ``treespec.models.quantized``); the same with its other types in bfloat16
(the file's weights, as loaded until those layers moved to int8), on the kernel; and, as the control, every layer
re-quantised to 4 bits from the float weights (what ``int4`` does to a model that has no file blocks), on the kernel.

    python experiments/gguf_fidelity.py --out experiments/results/gguf-fidelity-cpu
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import json
import math
from pathlib import Path

import torch

from treespec.bench.datasets import dataset_prompts, humaneval_tasks
from treespec.common.machine import machine
from treespec.models import DEFAULT_TARGET, load
from treespec.models.quantized import BFloat16Linear, Int8Linear, kernel_only, quantize_int4, replace_layers



def texts(humaneval: range, lee: range, max_tokens: int, tok) -> list[torch.Tensor]:
    tasks = humaneval_tasks(humaneval.start, humaneval.stop)
    raw = [t["prompt"] + t["canonical_solution"] for t in tasks] + [dataset_prompts("lee-news")[i] for i in lee]
    return [torch.tensor([tok(t)["input_ids"][:max_tokens]]) for t in raw]


@torch.inference_mode()
def compare(reference: torch.nn.Module, model: torch.nn.Module, batches: list[torch.Tensor]) -> dict[str, float]:
    agree = kl = nll = ref_nll = n = 0.0
    for ids in batches:
        ref = torch.log_softmax(reference(ids).logits[0, :-1].float(), -1)
        out = torch.log_softmax(model(ids).logits[0, :-1].float(), -1)
        nxt = ids[0, 1:]
        agree += (out.argmax(-1) == ref.argmax(-1)).sum().item()
        kl += (ref.exp() * (ref - out)).sum(-1).sum().item()
        nll -= out.gather(1, nxt[:, None]).sum().item()
        ref_nll -= ref.gather(1, nxt[:, None]).sum().item()
        n += nxt.numel()
    return {"next_token_agreement": agree / n, "kl_per_token": kl / n, "perplexity": math.exp(nll / n),
            "reference_perplexity": math.exp(ref_nll / n), "tokens": int(n)}


def with_bfloat16_rest(model: torch.nn.Module, reference: torch.nn.Module) -> torch.nn.Module:
    """``model`` (int4 as loaded) with its int8 layers back in bfloat16, from the file's float weights."""
    layers = dict(reference.named_modules())
    return replace_layers(model, Int8Linear, lambda name, _: BFloat16Linear.from_linear(layers[name]))


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", type=Path, default=Path("experiments/results/gguf-fidelity-cpu"))
    ap.add_argument("--target", default=DEFAULT_TARGET, help="a built-in GGUF model or a local .gguf file")
    ap.add_argument("--max-tokens", type=int, default=256, help="tokens per text")
    args = ap.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    reference, tok = load(args.target, dtype="float32")
    batches = texts(range(160, 164), range(40, 44), args.max_tokens, tok)
    int4 = "int4 (file blocks, other types int8)"
    def with_twins() -> torch.nn.Module:  # the twins kept whatever this machine runs prompts on
        return load(args.target, dtype="int4", prompt_twin="twin")[0]

    candidates = {"bfloat16": lambda: load(args.target, dtype="bfloat16")[0],
                  f"{int4}, the kernels (its steps)": with_twins,
                  f"{int4}, the bfloat16 twins (its prompts)": with_twins,
                  "int4 (file blocks, other types bfloat16), the kernel (its steps)":
                      lambda: with_bfloat16_rest(with_twins(), reference),
                  "int4 re-quantised from the float weights (control), the kernel":
                      lambda: quantize_int4(copy.deepcopy(reference), group_size=32, twin=None)}
    rows = {}
    for name, make in candidates.items():
        model = make()
        with kernel_only(model) if name.endswith("(its steps)") else contextlib.nullcontext():
            rows[name] = compare(reference, model, batches)
        print(name, rows[name], flush=True)
        del model
    result = {"machine": machine("cpu"), "target": args.target, "texts": "HumanEval 160-163 (prompt + canonical "
              "solution), lee-news leads 40-43", "max_tokens": args.max_tokens, "rows": rows}
    (args.out / "summary.json").write_text(json.dumps(result, indent=1))
    lines = ["| target as loaded | next-token agreement with float32 | KL per token | perplexity |",
             "|---|---|---|---|"]
    ref_ppl = next(iter(rows.values()))["reference_perplexity"]
    lines += [f"| float32 (the file dequantised: reference) | 100% | 0 | {ref_ppl:.3f} |"]
    lines += [f"| {k} | {r['next_token_agreement']:.2%} | {r['kl_per_token']:.5f} | {r['perplexity']:.3f} |"
              for k, r in rows.items()]
    (args.out / "README.md").write_text(
        f"# How faithful each loaded precision is to the GGUF file\n\nMachine: {result['machine']}. Target: "
        f"{args.target}. Text: {result['texts']}, {args.max_tokens} tokens each at most "
        f"({next(iter(rows.values()))['tokens']} next-token positions), teacher-forced.\n\n" + "\n".join(lines)
        + f"\n\nCommand: `python experiments/gguf_fidelity.py --out {args.out}`.\n")
    print("\n".join(lines))
    return result


if __name__ == "__main__":
    main()
