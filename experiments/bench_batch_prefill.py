"""A batch's prompts on this CPU: one forward of the rows padded to the longest under a mask, against each row's
prompt through a forward of its own (``kv.RowsCache.prompts``, what the eager batched step runs).

For the built-in pair as ``treespec generate`` loads it here (both int4: the target from its GGUF's 4-bit blocks,
prompts on its bfloat16 twins; the draft int4 with int8 twins for wide inputs), each batch of HumanEval prompts in
``--batches`` goes into an empty ``kv.RowsCache`` both ways (the asks the same but for ``Forward.prompt``), the order
alternating every round, median of ``--rounds``; each row's last logits are compared with its prompt's alone
(``kv.forward_prompt``), the largest difference printed.

    python experiments/bench_batch_prefill.py --out experiments/results/batch-prefill-cpu
"""

from __future__ import annotations

import argparse
import datetime
import json
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from a checkout without installing

from treespec.bench.datasets import dataset_prompts, encode_prompt, prompt_range  # noqa: E402
from treespec.common.machine import machine  # noqa: E402
from treespec.core.drafting import Forward  # noqa: E402
from treespec.core.kv import RowsCache, TreeCache, causal_allowed, forward_prompt  # noqa: E402
from treespec.models import DEFAULT_DRAFT, DEFAULT_TARGET, load  # noqa: E402

WAYS = ("padded", "rows")


def prefill(model: torch.nn.Module, prompts: list[torch.Tensor], rows: bool) -> dict[int, torch.Tensor]:
    """Every prompt into an empty ``RowsCache``: row by row (``rows``) or in one padded, masked forward."""
    asks = {r: Forward(p, torch.arange(len(p)), causal_allowed(0, len(p)), last=True, prompt=rows)
            for r, p in enumerate(prompts)}
    return RowsCache(len(prompts)).forward(model, asks)


def time_batch(role: str, model: torch.nn.Module, prompts: list[torch.Tensor], rounds: int) -> dict:
    alone = [forward_prompt(model, TreeCache(), p) for p in prompts]
    out = {way: prefill(model, prompts, way == "rows") for way in WAYS}  # warm-up, and the logits compared
    times: dict[str, list[float]] = {way: [] for way in WAYS}
    for r in range(rounds):
        for way in (WAYS if r % 2 == 0 else WAYS[::-1]):
            t = time.perf_counter()
            prefill(model, prompts, way == "rows")
            times[way].append(time.perf_counter() - t)
    row = {"model": role, "rows": len(prompts), "tokens": [len(p) for p in prompts],
           **{way: statistics.median(t) for way, t in times.items()},
           **{f"{way}_max_logit_diff_from_alone": max((out[way][r] - a).abs().max().item() for r, a in enumerate(alone))
              for way in WAYS}}
    print(json.dumps(row), flush=True)
    return row


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", type=Path, required=True, help="a directory: results.jsonl and README.md")
    ap.add_argument("--batches", nargs="+", default=["100:104", "104:108", "100:108"],
                    help="HumanEval prompt ranges, one batch each")
    ap.add_argument("--rounds", type=int, default=3)
    args = ap.parse_args(argv)
    torch.set_grad_enabled(False)
    args.out.mkdir(parents=True, exist_ok=True)
    texts = dataset_prompts("humaneval")
    rows = []
    for name, role in ((DEFAULT_DRAFT, "draft"), (DEFAULT_TARGET, "target")):
        model, tok = load(name, dtype="int4", role=role)
        for spec in args.batches:
            prompts = [torch.tensor(encode_prompt(tok, "humaneval", texts[i]))
                       for i in range(*prompt_range(spec, len(texts)))]
            rows.append({"prompts": spec, **time_batch(role, model, prompts, args.rounds)})
        del model
    with (args.out / "results.jsonl").open("w") as f:
        for row in rows:
            f.write(json.dumps(row) + "\n")
    lines = ["# A batch's prompts: one padded, masked forward against a forward per row\n",
             f"Machine: {machine('cpu')}, {torch.get_num_threads()} threads, torch {torch.__version__}; "
             f"{datetime.date.today()}. Built-in pair as `treespec generate` loads it here (int4 target, int4 draft); "
             f"HumanEval prompts; median of {args.rounds} rounds, the order alternating.\n\n"
             f"`python experiments/bench_batch_prefill.py --out {args.out.as_posix()} --batches "
             f"{' '.join(args.batches)} --rounds {args.rounds}`\n",
             "| model | prompts | tokens per row | padded s | row by row s | row by row / padded | "
             "last logits' largest difference from each prompt alone: padded, row by row |",
             "|---|---|---|---|---|---|---|"]
    for r in rows:
        lines.append(f"| {r['model']} | {r['prompts']} | {', '.join(map(str, r['tokens']))} | {r['padded']:.2f} | "
                     f"{r['rows']:.2f} | {r['rows'] / r['padded']:.2f} | "
                     f"{r['padded_max_logit_diff_from_alone']:.3g}, {r['rows_max_logit_diff_from_alone']:.3g} |")
    (args.out / "README.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
