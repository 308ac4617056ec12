"""How decoding costs grow with the context on this CPU: treespec's plain step, its tree step and HF's plain decoding
after prompts of several lengths, the question being whether the tuner's profile, timed after 128 cached tokens, may
stand for a run after a long prompt.

For the built-in pair as ``treespec generate`` loads it here (both int4), the first ``c`` tokens of HumanEval prompts
100-139 joined, for each ``c`` in ``--contexts``, then ``--new-tokens`` greedy tokens three ways:

* ``plain``: ``treespec.generate(..., budget=1)``, what a declined tree runs: its steps' seconds per token after the
  first (the first comes with the prefill);
* ``tree``: ``treespec.generate`` with the draft's depth-3 chain (the tuned tree here, without the confidence stop,
  so every step drafts three levels): seconds per step;
* ``hf``: HF ``generate`` (the profile's plain figure, ``timing.measure_plain_decode``): the mean gap between its
  tokens (``timing.TokenClock``).

Rounds alternate the contexts' order (a drift of the host falls on all alike); each figure is the median of
``--rounds``. The decision's quantity is the tree step over the plain step: at a fixed tau the decoding's speedup is
``tau * plain / tree``.

    python experiments/context_growth.py --out experiments/results/context-growth-cpu
"""

from __future__ import annotations

import argparse
import datetime
import json
import statistics
import sys
from pathlib import Path

import torch
from transformers import GenerationConfig

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from a checkout without installing

import treespec  # noqa: E402
from treespec.bench.datasets import dataset_prompts  # noqa: E402
from treespec.common.machine import machine  # noqa: E402
from treespec.models import DEFAULT_DRAFT, DEFAULT_TARGET, load  # noqa: E402
from treespec.models.timing import TokenClock  # noqa: E402

CHAIN = [(0,), (0, 0), (0, 0, 0)]  # the tuned tree on this host: a chain of depth 3 (budget 4)
WAYS = ("plain", "tree", "hf")


def decoding_seconds(stats: treespec.Stats) -> float:
    """The steps' seconds of a ``generate`` call (its prefill apart)."""
    return stats.drafting_seconds + stats.verifying_seconds + stats.overhead_seconds


def one_round(target: torch.nn.Module, draft: torch.nn.Module, prompt: list[int], tokens: int) -> dict[str, float]:
    """Each way's figure for one prompt (module docstring)."""
    plain = treespec.generate(target, prompt, max_new_tokens=tokens, budget=1).stats
    tree = treespec.generate(target, prompt, [treespec.ModelDrafter(draft, CHAIN)], max_new_tokens=tokens,
                             budget=len(CHAIN) + 1).stats
    clock = TokenClock(torch.device("cpu"))
    ids = torch.tensor([prompt])
    config = GenerationConfig(max_new_tokens=tokens, min_new_tokens=tokens, eos_token_id=[], pad_token_id=0,
                              do_sample=False)
    target.generate(ids, attention_mask=torch.ones_like(ids), generation_config=config, stopping_criteria=[clock])
    gaps = [b - a for a, b in zip(clock.stamps, clock.stamps[1:])]
    return {"plain": decoding_seconds(plain) / (plain.new_tokens - 1), "tree": decoding_seconds(tree) / tree.steps,
            "hf": sum(gaps) / len(gaps), "tree_tau": tree.tau}


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", type=Path, required=True, help="a directory: results.jsonl and README.md")
    ap.add_argument("--contexts", type=int, nargs="+", default=[128, 1024, 1900])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--new-tokens", type=int, default=32)
    args = ap.parse_args(argv)
    if args.new_tokens < 3 or args.rounds < 1:
        raise SystemExit("--new-tokens must be >= 3 and --rounds >= 1")
    torch.set_grad_enabled(False)
    args.out.mkdir(parents=True, exist_ok=True)
    target, tok = load(DEFAULT_TARGET, dtype="int4", role="target")
    draft, _ = load(DEFAULT_DRAFT, dtype="int4", role="draft")
    ids = tok("\n\n".join(dataset_prompts("humaneval")[100:140]))["input_ids"]
    if len(ids) < max(args.contexts):
        raise SystemExit(f"the joined prompts hold {len(ids)} tokens; ask for --contexts up to that")
    one_round(target, draft, ids[:min(args.contexts)], 4)  # warm-up
    runs: dict[int, list[dict[str, float]]] = {c: [] for c in args.contexts}
    with (args.out / "results.jsonl").open("w") as f:
        for r in range(args.rounds):
            for c in (args.contexts if r % 2 == 0 else args.contexts[::-1]):
                runs[c].append(one_round(target, draft, ids[:c], args.new_tokens))
                f.write(json.dumps({"round": r, "context": c, **runs[c][-1]}) + "\n")
                f.flush()
                print(r, c, {k: round(v * 1e3, 1) for k, v in runs[c][-1].items() if k in WAYS}, flush=True)
    med = {c: {k: statistics.median(run[k] for run in rs) for k in WAYS} for c, rs in runs.items()}
    first = med[min(args.contexts)]
    lines = ["# Decoding costs by context: treespec's plain and tree steps, HF's plain decoding\n",
             f"Machine: {machine('cpu')}, {torch.get_num_threads()} threads, torch {torch.__version__}; "
             f"{datetime.date.today()}. Built-in pair as `treespec generate` loads it here (int4 target, int4 draft); "
             f"the first tokens of HumanEval prompts 100-139 joined; {args.new_tokens} greedy tokens; median of "
             f"{args.rounds} rounds, the contexts' order alternating.\n\n`python experiments/context_growth.py --out "
             f"{args.out.as_posix()} --contexts {' '.join(map(str, args.contexts))} --rounds {args.rounds} "
             f"--new-tokens {args.new_tokens}`\n",
             "| context | treespec plain ms/token | tree (depth-3 chain) ms/step | HF plain ms/token | tree / plain | "
             "tree / HF | each against the shortest context: plain, tree, HF |", "|---|---|---|---|---|---|---|"]
    for c, m in med.items():
        lines.append(f"| {c} | {m['plain'] * 1e3:.1f} | {m['tree'] * 1e3:.1f} | {m['hf'] * 1e3:.1f} | "
                     f"{m['tree'] / m['plain']:.2f} | {m['tree'] / m['hf']:.2f} | "
                     + ", ".join(f"{m[k] / first[k]:.2f}" for k in WAYS) + " |")
    (args.out / "README.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
