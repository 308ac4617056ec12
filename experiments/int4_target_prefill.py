"""An int4 target's prompt on torch's int4 kernel against its layers' bfloat16 twins of the same 4-bit weights
(``treespec.models.quantized``: inputs of ``PROMPT_ROWS`` rows or more take the twin), and what that does to a whole
run. The built-in target in its GGUF file's own blocks (``load(..., dtype="int4")``), HumanEval ``--prompts``,
``--rounds`` rounds in alternating order:

* the target's prefill (the prompt less its last token, as treespec's prefill commits it; no logits), seconds;
* ``treespec.generate`` with the int4 draft (``dtype="auto"``) drafting a depth-``--depth`` chain, ``--tokens``
  greedy tokens: tok/s including the prefill, the int4 target with its twins and without them (the kernel for every
  input), beside the bfloat16 target (the file dequantised) with the same chain; greedy agreement of the two int4
  runs (the same model: they may differ at ties only);
* ``--tuned``: instead, each target with the tree the tuner sizes for it (``resolve``, the default recipe: Sequoia
  over the shipped acceptance of the int4 draft, the profile and pilot of that target's precision, cached), eager
  steps (``--compile``: the captured step, inductor with weight freezing, each arm's compiles paid in an untimed run
  of the first prompt): which precision of the GGUF's target is fastest here with its own best tree.

Run at 0a7121e (the commit that added the twins), the Zen 4 host (family 25 model 17), alone, 2 rounds, HumanEval
150-155 (63-272 prompt tokens), a depth-4 chain (what the tuner picked for this int4 target in
``experiments/results/llamacpp-cpu``), 64 tokens: prefill median **2.26 s with the twins, 3.21 s on the kernel**
(per prompt 1.70-3.39 against 2.12-5.48); whole runs **10.02 tok/s with the twins, 8.42 on the kernel**, 8.96 for
the bfloat16 target with the same chain; the int4 outputs identical with and without twins on 6/6 prompts.

``--tuned`` at 83df0b2 (same host, alone, 2 rounds): the tuner gave the int4 target a depth-3 chain (budget 4:
predicted tau 3.37, 0.197 s per step, against 0.093 s per token of HF's own decoding of the int4 model) and the
bfloat16 target its depth-8 chain (5.51, 0.413 s, 0.254 s per token plain): **int4 10.65 tok/s, bfloat16 9.58**,
prefill included (the int4 prefill median 2.75 s this time). ``--tuned --compile`` right after (the same trees in the
captured step, inductor with freezing; compiles 143 s for int4, 197 s for bfloat16, untimed): **int4 12.36 tok/s,
bfloat16 10.32**.

``--prefill-only`` (added with ``treespec.models.twin``) on the Zen 3 host (family 25 model 1, AVX2, no bfloat16
arithmetic), alone, HumanEval 150-152 (85-225 tokens), 2 rounds: prefill median **19.08 s on the twins, 7.90 s on
the kernels** (per prompt 11.88 / 18.85 / 32.83 s against 4.88 / 7.21 / 13.92 s in the first round): there a
bfloat16 product is slower than the int4 kernel, and ``load``'s measured choice (``prompt_twin="auto"``) drops the
twins.

    python experiments/int4_target_prefill.py --rounds 2 [--tuned [--compile]] [--prefill-only]
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import statistics
import time
import torch

import treespec
from tree_builders import TreeShape
from treespec.bench.datasets import humaneval_prompts
from treespec.calibrate.choices import resolve
from treespec.calibrate.vectors import acceptance_for_draft
from treespec.drafters.model import ModelDrafter
from treespec.models.loading import DEFAULT_DRAFT, DEFAULT_TARGET, load
from treespec.models.quantized import kernel_only
from treespec.recipes import Recipe, run


@torch.inference_mode()
def prefill_seconds(model: torch.nn.Module, ids: list[int]) -> float:
    start = time.perf_counter()
    model(torch.tensor([ids[:-1]]), use_cache=True, logits_to_keep=1)
    return time.perf_counter() - start


def prefill_only(int4: torch.nn.Module, prompts: list[list[int]], first: int, rounds: int) -> None:
    """The target's prefill of each prompt on its twins and on its kernels, alternated, and their medians."""
    arms = {"twins": contextlib.nullcontext, "kernel only": lambda: kernel_only(int4)}
    prefill: dict[str, list[float]] = {k: [] for k in arms}
    prefill_seconds(int4, prompts[0])  # warm-up
    for rnd in range(rounds):
        for i, ids in enumerate(prompts):
            for name in (list(arms) if rnd % 2 == 0 else list(arms)[::-1]):
                with arms[name]():
                    prefill[name].append(prefill_seconds(int4, ids))
            print(f"round {rnd} prompt {first + i} ({len(ids)} tokens): "
                  + ", ".join(f"{k} {v[-1]:.2f} s" for k, v in prefill.items()), flush=True)
    print("prefill median: " + ", ".join(f"{k} {statistics.median(v):.2f} s" for k, v in prefill.items()))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--prompts", default="150:156", metavar="A:B", help="HumanEval problems A..B-1")
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--depth", type=int, default=4, help="the chain's depth")
    ap.add_argument("--tokens", type=int, default=64)
    ap.add_argument("--tuned", action="store_true", help="each target with its own tuned tree (no kernel-only arm)")
    ap.add_argument("--compile", action="store_true", help="with --tuned: the captured step")
    ap.add_argument("--prefill-only", action="store_true",
                    help="the int4 target's prefill on its twins and on its kernels only (no runs, no bfloat16 target)")
    args = ap.parse_args()
    torch.set_num_threads(2)
    int4, tok = load(DEFAULT_TARGET, dtype="int4", role="target", prompt_twin="twin")
    a, b = (int(x) for x in args.prompts.split(":"))
    prompts = [tok(text)["input_ids"] for text in humaneval_prompts(a, b)]
    if args.prefill_only:
        return prefill_only(int4, prompts, a, args.rounds)
    bf16, _ = load(DEFAULT_TARGET, dtype="bfloat16", role="target")
    draft, _ = load(DEFAULT_DRAFT, dtype="auto", role="draft")
    chain = TreeShape.from_paths([tuple([0] * k) for k in range(1, args.depth + 1)])
    arms = {"int4, twins": (int4, contextlib.nullcontext), "int4, kernel only": (int4, lambda: kernel_only(int4)),
            "bfloat16": (bf16, contextlib.nullcontext)}
    generate = {k: (lambda m, ids: treespec.generate(m, ids, [ModelDrafter(draft, chain)], max_new_tokens=args.tokens))
                for k in arms}
    if args.tuned:
        del arms["int4, kernel only"]
        acceptance, walk = acceptance_for_draft(None, 0.0, draft)
        for name, (model, _) in arms.items():
            resolved = resolve(Recipe(tree="sequoia", acceptance=acceptance), model, [draft], tokenizer=tok,
                               max_new_tokens=args.tokens, walk=walk)
            print(f"{name}: {resolved.why}", flush=True)
            recipe = dataclasses.replace(resolved.recipe, compile=args.compile)
            generate[name] = lambda m, ids, r=recipe: run(r, m, [draft], ids, max_new_tokens=args.tokens)
            if args.compile:
                torch._inductor.config.freezing = True  # as bench_llamacpp's captured method
                start = time.perf_counter()
                generate[name](model, prompts[0])
                print(f"{name}: compiled in an untimed first run of {time.perf_counter() - start:.0f} s", flush=True)
    prefill = {k: [] for k in arms if k != "bfloat16"}
    tokens = {k: 0 for k in arms}
    seconds = {k: 0.0 for k in arms}
    outputs: dict[str, list] = {k: [] for k in arms}
    treespec.generate(int4, prompts[0], [ModelDrafter(draft, chain)], max_new_tokens=4)  # warm-up
    for rnd in range(args.rounds):
        order = list(arms) if rnd % 2 == 0 else list(arms)[::-1]
        for i, ids in enumerate(prompts):
            for name in order:
                model, context = arms[name]
                with context():
                    if name in prefill:
                        prefill[name].append(prefill_seconds(model, ids))
                    out = generate[name](model, ids)
                tokens[name] += len(out.new_tokens)
                seconds[name] += out.stats.seconds
                if rnd == 0:
                    outputs[name].append(out.new_tokens)
            print(f"round {rnd} prompt {a + i} ({len(ids)} tokens): "
                  + ", ".join(f"{k} prefill {v[-1]:.2f} s" for k, v in prefill.items()), flush=True)
    for name in arms:
        extra = (f", prefill median {statistics.median(prefill[name]):.2f} s" if name in prefill else "")
        print(f"{name}: {tokens[name] / seconds[name]:.2f} tok/s{extra}")
    if "int4, kernel only" in outputs:
        same = sum(x == y for x, y in zip(outputs["int4, twins"], outputs["int4, kernel only"]))
        print(f"int4 outputs identical with and without twins on {same}/{len(prompts)} prompts")


if __name__ == "__main__":
    main()
