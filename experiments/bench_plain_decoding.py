"""treespec's plain decoding (``--budget 1``, and what a tree declined by the tuner's margin runs) against HF
``generate`` eager on the same model, and against treespec's plain decoding as it ran before commit d1eda19.

Three methods per prompt, their order rotating every prompt and round (the host's speed drifts by several percent
within minutes):

* ``hf``: HF ``generate`` eager, greedy (its prefill gives the first token);
* ``treespec``: ``treespec.generate(target, ids, budget=1)``: its prefill takes the prompt's last token too and
  its logits give the first token, as HF's do (``EagerStep.prefill``);
* ``treespec-root-forwarded``: treespec as it decoded plainly before, the eager step with its prefill as it was
  (:class:`RootForwarded`): the prompt but its last token cached, the first step forwarding the root alone (one
  forward more per generation, and the last prompt token's row and logits from a one-row forward).

The figure is the paired speedup over HF (HF's seconds over the method's, summed over prompts and rounds) with a
bootstrap 95% interval, and the seconds per token of each, prefill included. Greedy outputs are compared with HF's.

    python experiments/bench_plain_decoding.py --out experiments/results/plain-decoding-cpu
"""

from __future__ import annotations

import argparse
import datetime
import itertools
import json
import sys
import time
from pathlib import Path
from typing import Callable

import torch

import treespec
from treespec.bench import intervals
from treespec.bench.baselines import hf_generate
from treespec.bench.datasets import DATASETS, dataset_prompts, encode_prompt, prompt_range
from treespec.common.machine import machine
from treespec.core.engine import EagerStep, decode
from treespec.core.request import Request
from treespec.core.step import Clock
from treespec.models import DEFAULT_TARGET, load


class RootForwarded(EagerStep):
    """The eager step as it prefilled before d1eda19: the prompt but its last token, no logits held, so the first
    step forwards the root (a drafter that never proposed reproduced it until c32f122, run for the committed
    result at 9e03f75; since then a speculating step's prefill takes the whole prompt too)."""

    def prefill(self, prompt: list[int], clock: Clock) -> None:
        if len(prompt) > 1:
            super().prefill(prompt[:-1], clock)
        self.root_logits = None


def root_forwarded(target: torch.nn.Module, ids: list[int], n: int) -> list[int]:
    """Plain greedy decoding of ``n`` tokens through :class:`RootForwarded`."""
    req = Request.checked(target, ids, [], n, 0.0, 0, 1.0, None, 0, 1, None, "rrs", False)
    return decode(req, RootForwarded(req, req.start())).new_tokens


def methods(target: torch.nn.Module) -> dict[str, Callable[[list[int], int], tuple[list[int], float]]]:
    """name -> run(prompt ids, new tokens) -> (new tokens, seconds)."""

    def timed(generate: Callable[[list[int], int], list[int]]) -> Callable[[list[int], int], tuple[list[int], float]]:
        def run(ids: list[int], n: int) -> tuple[list[int], float]:
            start = time.perf_counter()
            tokens = generate(ids, n)
            return tokens, time.perf_counter() - start
        return run

    return {"hf": lambda ids, n: hf_generate(target, ids, n),
            "treespec": timed(lambda ids, n: treespec.generate(target, ids, max_new_tokens=n, budget=1).new_tokens),
            "treespec-root-forwarded": timed(lambda ids, n: root_forwarded(target, ids, n))}


def report(records: list[dict], args: argparse.Namespace, command: str) -> str:
    hf = [r["seconds"]["hf"] for r in records]
    rows = []
    for name in ("treespec", "treespec-root-forwarded"):
        ci = intervals.ratio_of_sums(hf, [r["seconds"][name] for r in records])
        per_token = sum(r["seconds"][name] for r in records) / sum(r["tokens"] for r in records)
        same = sum(r["same_as_hf"][name] for r in records)
        rows.append(f"| {name} | {per_token * 1000:.1f} | **{ci.estimate:.3f}x** [{ci.low:.3f}, {ci.high:.3f}] | "
                    f"{same}/{len(records)} |")
    hf_per_token = sum(hf) / sum(r["tokens"] for r in records)
    gain = intervals.ratio_of_sums([r["seconds"]["treespec-root-forwarded"] for r in records],
                                   [r["seconds"]["treespec"] for r in records])
    return "\n".join([
        f"# treespec's plain decoding against HF eager ({machine('cpu')}, torch {torch.__version__})", "",
        f"`{command}`, {datetime.date.today()}: {args.target} in {args.dtype}, greedy, {args.max_new_tokens} new "
        f"tokens, {args.dataset} prompts {args.prompts}, {args.rounds} rounds, the three methods' order rotating "
        "per prompt. Speedup: HF's seconds over the method's, summed over prompts and rounds, paired bootstrap 95% "
        "interval; ms per token: seconds (prefill included) over new tokens.", "",
        "| method | ms per token | speedup over HF eager | greedy = HF |", "|---|---|---|---|",
        f"| hf | {hf_per_token * 1000:.1f} | 1 | |", *rows, "",
        f"treespec over treespec-root-forwarded (the change itself, paired): **{gain.estimate:.3f}x** "
        f"[{gain.low:.3f}, {gain.high:.3f}]; the forward it saves is 1/{args.max_new_tokens} of the decoding "
        "steps.", ""])


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, required=True, help="folder for results.jsonl and README.md")
    ap.add_argument("--target", default=DEFAULT_TARGET, help="model id or path (default: the built-in target)")
    ap.add_argument("--dtype", default="int4", help="the target's precision (default int4: the CLI's GGUF target)")
    ap.add_argument("--dataset", choices=DATASETS, default="humaneval")
    ap.add_argument("--prompts", default="100:106", metavar="A:B", help="prompts A..B-1 of the dataset")
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--max-new-tokens", type=int, default=64)
    args = ap.parse_args(argv)
    if args.rounds < 1 or args.max_new_tokens < 2:
        ap.error("--rounds must be >= 1 and --max-new-tokens >= 2")
    texts = dataset_prompts(args.dataset)
    a, b = prompt_range(args.prompts, len(texts))
    target, tok = load(args.target, dtype=args.dtype)
    prompts = [encode_prompt(tok, args.dataset, t) for t in texts[a:b]]
    runs = methods(target)
    for run in runs.values():  # warm-up, untimed
        run(prompts[0], 4)
    args.out.mkdir(parents=True, exist_ok=True)
    path = args.out / "results.jsonl"
    done = [json.loads(line) for line in path.open()] if path.exists() else []
    finished = {(r["round"], r["prompt"]) for r in done}
    orders = itertools.cycle(itertools.permutations(runs))
    for rnd in range(args.rounds):
        for i, ids in enumerate(prompts):
            order = next(orders)
            if (rnd, a + i) in finished:  # a re-run resumes
                continue
            out = {name: runs[name](ids, args.max_new_tokens) for name in order}
            record = {"round": rnd, "prompt": a + i, "tokens": args.max_new_tokens, "order": list(order),
                      "seconds": {k: v[1] for k, v in out.items()},
                      "same_as_hf": {k: v[0] == out["hf"][0] for k, v in out.items()}}
            with path.open("a") as f:
                f.write(json.dumps(record) + "\n")
            done.append(record)
            print(f"round {rnd} prompt {a + i}: " + ", ".join(f"{k} {v[1]:.2f} s" for k, v in out.items()),
                  flush=True)
    command = " ".join(["python experiments/bench_plain_decoding.py", *(sys.argv[1:] if argv is None else argv)])
    text = report(done, args, command)
    (args.out / "README.md").write_text(text)
    print(text)


if __name__ == "__main__":
    main()
