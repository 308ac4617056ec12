"""Engine overhead per step versus model forward time, for tree budgets 8..128 on a tiny model.

The engine's own time (trie merge, DFS flattening, mask, acceptance walk, KV commit) is
``Stats.overhead_seconds``; the target's tree forward is ``verifying_seconds`` and the draft model's
work ``drafting_seconds``. Trees are Sequoia shapes for a fixed synthetic acceptance vector, so each
budget gets a tree of exactly that many nodes.

    python experiments/bench_overhead.py --out experiments/results/overhead-cpu.md
"""

from __future__ import annotations

import argparse
import platform
from pathlib import Path

import torch

from treespec.recipes import Recipe, run
from treespec.models.tiny import tiny_model

ACCEPTANCE = [0.55, 0.15, 0.07, 0.04, 0.02, 0.01]


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--budgets", type=int, nargs="+", default=[8, 16, 32, 64, 128])
    ap.add_argument("--vocab", type=int, default=32000)
    ap.add_argument("--hidden", type=int, default=128)
    ap.add_argument("--layers", type=int, default=2)
    ap.add_argument("--new-tokens", type=int, default=64)
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--out", type=Path, default=None)
    args = ap.parse_args(argv)

    target = tiny_model(vocab=args.vocab, hidden=args.hidden, layers=args.layers, seed=0,
                        max_positions=4096).to(args.device)
    draft = tiny_model(vocab=args.vocab, hidden=args.hidden, layers=1, seed=1, max_positions=4096).to(args.device)
    prompt = list(range(1, 33))
    lines = [
        f"# Engine overhead per step (tiny Llama: vocab {args.vocab}, hidden {args.hidden}, {args.layers} layers)",
        "",
        f"Machine: {platform.platform()}, {torch.get_num_threads()} threads, device {args.device}, "
        f"torch {torch.__version__}. {args.new_tokens} new tokens per run; times are ms per step.",
        "",
        "| temperature | budget | steps | engine ms | target fwd ms | draft ms | engine / target fwd |",
        "|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for temperature in (0.0, 1.0):
        for budget in args.budgets:
            recipe = Recipe(tree="sequoia", budget=budget, depth=8, temperature=temperature, acceptance=ACCEPTANCE)
            run(recipe, target, [draft], prompt, max_new_tokens=8, seed=0)  # warm-up
            s = run(recipe, target, [draft], prompt, max_new_tokens=args.new_tokens, seed=1).stats
            def per(x):
                return 1000 * x / s.steps
            lines.append(f"| {temperature} | {budget} | {s.steps} | {per(s.overhead_seconds):.2f} | "
                         f"{per(s.verifying_seconds):.2f} | {per(s.drafting_seconds):.2f} | "
                         f"{s.overhead_seconds / s.verifying_seconds:.2f} |")
            print(lines[-1], flush=True)
    text = "\n".join(lines) + "\n"
    print(text)
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(text)


if __name__ == "__main__":
    main()
