"""Why an eager forward passes ``logits_to_keep`` as an index (``treespec.core.attention.last_rows``), on this machine.

HF's causal LMs slice the hidden states for an int ``logits_to_keep``; the LM head over that slice (a view at an
offset into the prompt's hidden states) can take a much slower CPU kernel than over a tensor of its own. Measured
side by side in one process on the real target (Qwen2.5-Coder-1.5B, the precision ``treespec`` picks here):

* the LM head alone over one row: a slice view of ``[1, n, h]``, the same view ``.contiguous()`` (a no-op: it is
  contiguous), and the row gathered by an index;
* a prompt's whole eager forward (HumanEval 100, one forward through ``forward_masked``) with HF's int
  ``logits_to_keep=1`` called directly (``model(...)``) and through ``tree_forward`` (the index).

    python experiments/bench_lm_head_slice.py --out experiments/results/lm-head-slice-cpu.md
"""

from __future__ import annotations

import argparse
import os
import time
from pathlib import Path

import torch

from treespec.bench.datasets import dataset_prompts
from treespec.common.machine import cpu_model
from treespec.core.kv import TreeCache, causal_allowed, forward_masked
from treespec.models import DEFAULT_TARGET, load


def best_of(f, reps: int) -> float:
    f()
    times = []
    for _ in range(reps):
        t = time.perf_counter()
        f()
        times.append(time.perf_counter() - t)
    return min(times)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", type=Path, default=Path("experiments/results/lm-head-slice-cpu.md"))
    ap.add_argument("--reps", type=int, default=3)
    args = ap.parse_args()
    target, tok = load(DEFAULT_TARGET, dtype="auto", role="target")
    ids = tok(dataset_prompts("humaneval")[100])["input_ids"][:-1]
    n, dtype = len(ids), next(target.parameters()).dtype
    h = torch.randn(1, n, target.config.hidden_size, dtype=dtype)
    rows = {"LM head over a slice view of the last row": lambda: target.lm_head(h[:, -1:, :]),
            "LM head over the same view .contiguous()": lambda: target.lm_head(h[:, -1:, :].contiguous()),
            "LM head over the row gathered by an index": lambda: target.lm_head(h[:, torch.tensor([n - 1]), :])}
    x, pos, allowed = torch.tensor(ids), torch.arange(n), causal_allowed(0, n)
    mask = torch.zeros(n, n, dtype=dtype).masked_fill_(~allowed, torch.finfo(dtype).min)[None, None]
    rows[f"whole forward over {n} prompt tokens, HF's int logits_to_keep=1"] = lambda: target(
        input_ids=x[None], position_ids=pos[None], attention_mask=mask, past_key_values=TreeCache(), use_cache=True,
        logits_to_keep=1)
    rows[f"whole forward over {n} prompt tokens, through tree_forward (the index)"] = lambda: forward_masked(
        target, TreeCache(), x, pos, allowed, logits_to_keep=1)
    lines = [f"# LM head over a slice vs an index, CPU\n\nMachine: {cpu_model()}, {os.cpu_count()} cores, "
             f"{torch.get_num_threads()} torch threads, torch {torch.__version__}; target {DEFAULT_TARGET} in {dtype}.",
             f"Command: `python experiments/bench_lm_head_slice.py --out {args.out}` (best of {args.reps}).\n",
             "| what | ms |", "|---|---|"]
    with torch.inference_mode():
        for label, f in rows.items():
            lines.append(f"| {label} | {1000 * best_of(f, args.reps):.0f} |")
            print(lines[-1], flush=True)
    args.out.write_text("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
