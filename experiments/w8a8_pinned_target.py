"""Could fbgemm's dynamic int8 product run an exact target? A probe for issue 42's gap to llama.cpp.

``torch.ao``'s dynamic int8 Linear (fbgemm: int8 weights per output channel, activations quantised to 8 bits on the
fly, VNNI integer products) keeps a target's forward at the memory's speed up to 9 rows (``linear_kernels_by_rows``),
but it takes one activation scale for a whole input, so a row's result depends on the rows beside it: a tree's rows
would not compute what one-token forwards compute. Here each row is scaled to the range [-127, 127] by its own
largest magnitude, and one constant row holding -127 and 127 is appended, so every input's range, and so its one
scale and zero point, are the same: each row's integer product is its own (exact in int32), and its result is
rescaled by its own factor. A probe, not a treespec precision: the model is the file's weights re-quantised to int8
per channel with 8-bit activations per row (llama.cpp's products take 8-bit activations per block of 256 too), not
the file's 4-bit blocks, so its fidelity to the file is measured beside its speed:

* rows independent: the last row of a 9-row input against the same row alone, every layer of the model, bit for bit;
* a forward of the whole built-in target after a 128-token context, 1 / 4 / 9 / 16 tokens (``measure_latency``),
  beside the int4 target as treespec loads it (the file's blocks, its other tensors in int8);
* next-token KL from the file's float32 dequantisation and agreement, on ``gguf_fidelity``'s held-out text.

    python experiments/w8a8_pinned_target.py --out experiments/results/w8a8-pinned-cpu
"""

from __future__ import annotations

import argparse
import copy
import json
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).parent))
from gguf_fidelity import compare, texts  # noqa: E402

from treespec.common.machine import machine  # noqa: E402
from treespec.models import DEFAULT_TARGET, load  # noqa: E402
from treespec.models.quantized import quantize_int8, replace_layers  # noqa: E402
from treespec.models.timing import measure_latency  # noqa: E402


class PinnedInt8Linear(torch.nn.Module):
    """``linear`` on fbgemm's dynamic int8 product with each row's own activation scale (module doc)."""

    def __init__(self, linear: torch.nn.Linear, reduce_range: bool) -> None:
        super().__init__()
        copy_ = torch.nn.Linear(linear.in_features, linear.out_features, bias=False)
        copy_.weight.data = linear.weight.detach().float().clone()
        self.packed = quantize_int8(torch.nn.Sequential(copy_))[0]._packed_params._packed_params
        self.bias = None if linear.bias is None else linear.bias.detach().float().clone()
        pin = torch.zeros(1, linear.in_features)
        pin[0, 0], pin[0, 1] = -127.0, 127.0
        self.pin, self.reduce_range, self.out_features = pin, reduce_range, linear.out_features

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        flat = x.reshape(-1, x.shape[-1]).float()
        scale = flat.abs().amax(1, keepdim=True).clamp_min(1e-12) / 127
        rows = torch.cat([flat / scale, self.pin])
        y = torch.ops.quantized.linear_dynamic(rows, self.packed, self.reduce_range)[:-1] * scale
        if self.bias is not None:
            y = y + self.bias
        return y.view(*x.shape[:-1], self.out_features).to(x.dtype)


def pinned(model: torch.nn.Module, reduce_range: bool) -> torch.nn.Module:
    return replace_layers(model, torch.nn.Linear, lambda _, linear: PinnedInt8Linear(linear, reduce_range))


def rows_independent(model: torch.nn.Module) -> bool:
    layers = [m for m in model.modules() if isinstance(m, PinnedInt8Linear)]
    gen = torch.Generator().manual_seed(0)
    for layer in layers:
        x = torch.randn(9, layer.pin.shape[1], generator=gen) * torch.logspace(-2, 1, 9)[:, None]
        if not torch.equal(layer(x)[-1:], layer(x[-1:])):
            return False
    return True


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, default=Path("experiments/results/w8a8-pinned-cpu"))
    args = ap.parse_args()
    torch.set_num_threads(2)
    args.out.mkdir(parents=True, exist_ok=True)
    reference, tok = load(DEFAULT_TARGET, dtype="float32")
    batches = texts(range(160, 164), range(40, 44), 256, tok)
    rows = {}
    arms = {"w8a8 pinned, 8-bit activations": lambda: pinned(copy.deepcopy(reference), False),
            "w8a8 pinned, 7-bit activations (torch.ao's reduce_range)": lambda: pinned(copy.deepcopy(reference), True),
            "int4 as treespec loads it (file blocks, other types int8)": lambda: load(DEFAULT_TARGET, dtype="int4")[0]}
    for name, make in arms.items():
        model = make()
        row = {"rows_independent": rows_independent(model) if name.startswith("w8a8") else None,
               "forward_ms": {n: 1e3 * t for n, t in measure_latency(model, (1, 4, 9, 16), repeats=5).items()},
               **compare(reference, model, batches)}
        rows[name] = row
        print(name, row, flush=True)
        del model
    result = {"machine": machine("cpu"), "rows": rows}
    (args.out / "summary.json").write_text(json.dumps(result, indent=1))
    lines = ["| target | rows independent | forward ms at 1 / 4 / 9 / 16 tokens | KL per token | agreement |",
             "|---|---|---|---|---|"]
    lines += [f"| {k} | {r['rows_independent'] if r['rows_independent'] is not None else '(each row on its own)'} | "
              + " / ".join(f"{v:.0f}" for v in r["forward_ms"].values())
              + f" | {r['kl_per_token']:.5f} | {r['next_token_agreement']:.2%} |" for k, r in rows.items()]
    print("\n".join(lines))
    (args.out / "README.md").write_text(
        f"# fbgemm's dynamic int8 with pinned activation ranges as a target (a probe)\n\nMachine: {result['machine']}."
        f" Command: `python experiments/w8a8_pinned_target.py --out {args.out}`.\n\n" + "\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
