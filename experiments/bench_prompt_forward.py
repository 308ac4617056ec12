"""The eager prompt forward on this CPU: a causal 4D mask against no mask, beside HF's own prefill, and the draft's
prefill cost curve against what it predicts.

For the built-in pair as ``treespec generate`` loads it here (both int4: the target from its GGUF's 4-bit blocks,
prompts on its bfloat16 twins; the draft int4 with int8 twins for wide inputs), a prompt of each length in
``--lengths`` (the first tokens of HumanEval prompts 100 on, joined) goes into an empty cache three ways, the order
rotating every round, median of ``--rounds``:

* ``masked``: ``kv.forward_masked`` with ``kv.causal_allowed`` (an additive ``[n, n]`` mask; the eager step's and
  a model drafter's prefill before ``kv.forward_prompt``);
* ``prompt``: ``kv.forward_prompt`` (no mask passed: the model's own causal route, treespec's kernels);
* ``hf``: the stock model on HF's ``DynamicCache``, as HF ``generate``'s prefill runs it;
* ``static-masked``: the compiled steps' static cache (``StaticTreeCache``, the capacity a run of 64 new tokens
  gets) filled by its own forward under a causal mask over the whole capacity (``prefill_rows`` before it took
  ``forward_prompt``; every int4 model's prompt on the compiled route, whose twins cannot be traced);
* ``static``: ``StaticTreeCache.prefill_rows`` (``forward_prompt`` into a growable cache, copied to the slots).

Each of the first three prints the last row's logits' largest difference from ``hf``. Then the draft's prefill curve
(``timing.measure_prefill`` at ``timing.PREFILL_LENGTHS``, what the tuner charges a run:
``Profile.draft_prefill_seconds``) predicts each length, beside the draft's ``prompt`` time measured above.

    python experiments/bench_prompt_forward.py --out experiments/results/prompt-forward-cpu
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
from transformers import DynamicCache

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from a checkout without installing

from treespec.bench.datasets import dataset_prompts  # noqa: E402
from treespec.calibrate.costs import Profile  # noqa: E402
from treespec.common.machine import machine  # noqa: E402
from treespec.core.compiled import capacity_for  # noqa: E402
from treespec.core.kv import TreeCache, causal_allowed, forward_masked, forward_prompt  # noqa: E402
from treespec.core.static_cache import StaticTreeCache  # noqa: E402
from treespec.models import DEFAULT_DRAFT, DEFAULT_TARGET, load  # noqa: E402
from treespec.models.timing import PREFILL_LENGTHS, measure_prefill  # noqa: E402


def ways(model: torch.nn.Module, ids: torch.Tensor) -> dict:
    n = len(ids)
    static = StaticTreeCache(model, capacity_for(n + 1, 64 + 16))

    def static_masked() -> None:
        static.reset()
        static.forward(model, ids, torch.arange(n), torch.ones(n, n, dtype=torch.bool).tril(), logits_to_keep=1)

    return {
        "static-masked": static_masked,
        "static": lambda: static.prefill_rows(model, [ids.tolist() + [0]]),
        "masked": lambda: forward_masked(model, TreeCache(), ids, torch.arange(n), causal_allowed(0, n),
                                         logits_to_keep=1),
        "prompt": lambda: forward_prompt(model, TreeCache(), ids),
        "hf": lambda: model(input_ids=ids[None], past_key_values=DynamicCache(), use_cache=True,
                            logits_to_keep=1).logits[0],
    }


def time_model(role: str, model: torch.nn.Module, prompt: list[int], lengths: list[int], rounds: int) -> list[dict]:
    rows = []
    for n in lengths:
        fns = ways(model, torch.tensor(prompt[:n]))
        names = list(fns)
        last = {name: fn() for name, fn in fns.items()}  # warm-up, and the logits compared (the first three)
        times: dict[str, list[float]] = {name: [] for name in names}
        for r in range(rounds):
            for name in names[r % len(names):] + names[:r % len(names)]:
                t = time.perf_counter()
                fns[name]()
                times[name].append(time.perf_counter() - t)
        row = {"model": role, "tokens": n, **{name: statistics.median(t) for name, t in times.items()}}
        for name in ("masked", "prompt"):
            row[f"{name}_max_logit_diff"] = (last[name] - last["hf"]).abs().max().item()
        rows.append(row)
        print(json.dumps(row), flush=True)
    return rows


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", type=Path, required=True, help="a directory: results.jsonl and README.md")
    ap.add_argument("--lengths", type=int, nargs="+", default=[128, 512, 1024, 1900])
    ap.add_argument("--rounds", type=int, default=3)
    args = ap.parse_args(argv)
    torch.set_grad_enabled(False)
    args.out.mkdir(parents=True, exist_ok=True)
    target, tok = load(DEFAULT_TARGET, dtype="int4", role="target")
    draft, _ = load(DEFAULT_DRAFT, dtype="int4", role="draft")
    prompt = tok("\n\n".join(dataset_prompts("humaneval")[100:140]))["input_ids"]
    if len(prompt) < max(args.lengths):
        raise SystemExit(f"the joined prompts hold {len(prompt)} tokens; ask for --lengths up to that")
    rows = time_model("draft", draft, prompt, args.lengths, args.rounds)
    curve = measure_prefill(draft)
    predict = Profile({1: 1.0}, draft_prefill_latency=curve)
    for row in rows:
        row["predicted_from_curve"] = predict.draft_prefill_seconds(row["tokens"])
    rows += time_model("target", target, prompt, args.lengths, args.rounds)
    with (args.out / "results.jsonl").open("w") as f:
        for row in rows:
            f.write(json.dumps(row) + "\n")
    lines = ["# The eager prompt forward: a causal 4D mask against none, beside HF's prefill\n",
             f"Machine: {machine('cpu')}, {torch.get_num_threads()} threads, torch {torch.__version__}; "
             f"{datetime.date.today()}. Built-in pair as `treespec generate` loads it here (int4 target, int4 draft); "
             f"the first tokens of HumanEval prompts 100-139 joined; median of {args.rounds} rounds, the order "
             f"rotating.\n\n`python experiments/bench_prompt_forward.py --out {args.out.as_posix()} --lengths "
             f"{' '.join(map(str, args.lengths))} --rounds {args.rounds}`\n",
             "| model | tokens | masked s | prompt (no mask) s | HF stock s | prompt / masked | prompt / HF | "
             "logits max diff from HF: masked, prompt | static cache, masked s | static cache, no mask s | "
             "static: no mask / masked |", "|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        lines.append(f"| {r['model']} | {r['tokens']} | {r['masked']:.3f} | {r['prompt']:.3f} | {r['hf']:.3f} | "
                     f"{r['prompt'] / r['masked']:.3f} | {r['prompt'] / r['hf']:.3f} | "
                     f"{r['masked_max_logit_diff']:.2g}, {r['prompt_max_logit_diff']:.2g} | "
                     f"{r['static-masked']:.3f} | {r['static']:.3f} | {r['static'] / r['static-masked']:.3f} |")
    lines += ["", f"The draft's prefill curve (`measure_prefill` at {list(PREFILL_LENGTHS)} tokens: "
              + ", ".join(f"{k}: {v:.3f} s" for k, v in sorted(curve.items()))
              + ") against the draft's no-mask prompt forward timed above:", "",
              "| tokens | predicted s | measured s | predicted / measured |", "|---|---|---|---|"]
    for r in rows:
        if r["model"] == "draft":
            lines.append(f"| {r['tokens']} | {r['predicted_from_curve']:.3f} | {r['prompt']:.3f} | "
                         f"{r['predicted_from_curve'] / r['prompt']:.2f} |")
    (args.out / "README.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
