"""A draft whose LM head covers only the most frequent tokens (FR-Spec's lever), measured on this CPU.

The 0.5B draft's LM head (896 x 151,936) is about 28% of its per-token weights; a draft level is
bound by streaming weights at the captured step's widths, so a head over the K most frequent tokens
should make a level cheaper. It stays exact: the trimmed draft is just another draft (its ``q`` is
zero outside the kept tokens, the proposals are drawn from that ``q`` and the verifier is given it),
but a token outside the kept set can never be proposed, so acceptance drops where the target writes
one. Measured here, for K in ``--keep``:

1. **Coverage**: the share of tokens of evaluation-like text (HumanEval 100-163 prompts with their
   canonical solutions; Lee news articles 0-9) inside the kept set. The set: the K most frequent
   tokens of a calibration corpus disjoint from that text (HumanEval 0-99 with solutions, Lee news
   articles 10-299), topped up by the lowest ids (BPE merges come roughly in order of frequency).
2. **Agreement**: how often the draft's argmax is the target's (1.5B, bfloat16), teacher-forced, after
   each of HumanEval 100-115 (code) and Lee news 0-7 split at a third (prose), 96 tokens each; for the
   trimmed head, the argmax over the kept tokens (the trimmed head's logits are the full head's kept
   rows: int4 groups run along a row, so quantising either gives the same rows).
3. **Draft level**: one compiled forward (static cache, inductor with weight freezing) of the int4
   draft (group 128, the captured step's) over w tree tokens after 200 tokens of context, full head
   against trimmed heads (``bench_draft_level.level_timer``).

The projection (printed, labelled): a chain of ``--depth`` tokens, every position accepted with the
agreement rate ``a`` (tau = (1 - a^(d+1)) / (1 - a)), a step = d levels of width 1 plus a verification
of ``--verify-ms``; tokens per second trimmed / full.

``--engine K`` measures instead: ``treespec generate --compile``'s recipe (the captured step, tuned
for the built-in pair) run with two int4 drafts built the same way from the float32 draft, one with
the full head and one with the K-token head (HumanEval 100-109, Lee news leads 0-9, 64 greedy
tokens), records appended to ``--records`` (a re-run resumes); the paired speedup of the trimmed
draft with its bootstrap interval. Two captured runners with frozen weights do not fit in 24 GiB
together, so each draft runs in its own process (``--engine-draft``, one after the other, not
interleaved per prompt); the report is written from whatever records exist.

    python experiments/bench_trimmed_head.py --out experiments/results/trimmed-head-cpu.md
    python experiments/bench_trimmed_head.py --engine 32768 --out experiments/results/trimmed-head-engine.md
"""

from __future__ import annotations

import argparse
import copy
import sys
from collections import Counter
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from a checkout without installing

import bench_draft_level as levels  # noqa: E402
from treespec.bench.datasets import _lee_articles, humaneval_tasks  # noqa: E402
from treespec.common.machine import machine  # noqa: E402
from treespec.models import DEFAULT_DRAFT, DEFAULT_TARGET, load  # noqa: E402
from treespec.models.quantized import quantize_int4  # noqa: E402


class TrimmedHead(torch.nn.Module):
    """An LM head over the ``keep`` rows of ``head``; returns logits over the whole vocabulary, -inf
    outside ``keep`` (so everything downstream, selection and ``q``, works unchanged)."""

    def __init__(self, head: torch.nn.Linear, keep: torch.Tensor) -> None:
        super().__init__()
        self.vocab = head.out_features
        self.proj = torch.nn.Linear(head.in_features, len(keep), bias=False)
        with torch.no_grad():
            self.proj.weight.copy_(head.weight[keep])
        self.register_buffer("keep", keep.clone())

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        sub = self.proj(hidden)
        full = sub.new_full((*sub.shape[:-1], self.vocab), float("-inf"))
        return full.index_copy(-1, self.keep, sub)


def kept_tokens(counts: Counter, k: int, vocab: int) -> np.ndarray:
    """The ``k`` most frequent ids of ``counts``, topped up by the lowest ids not among them."""
    keep = [t for t, _ in counts.most_common(k)]
    seen = set(keep)
    keep += [t for t in range(vocab) if t not in seen][: k - len(keep)]
    return np.sort(np.array(keep))


def calibration_counts(tok) -> Counter:
    """Token counts of the calibration corpus (HumanEval 0-99 with solutions, Lee news articles 10-299)."""
    counts = Counter()
    for text in [t["prompt"] + t["canonical_solution"] for t in humaneval_tasks(0, 100)] + _lee_articles()[10:300]:
        counts.update(tok(text)["input_ids"])
    return counts


def engine(args: argparse.Namespace) -> str:
    """The captured step with the full head and with a ``args.engine``-token head, side by side."""
    from treespec.bench import compare, intervals
    from treespec.bench.datasets import dataset_prompts
    from treespec.calibrate.vectors import default_acceptance
    from treespec.models import cache_root
    from treespec.models.precision import precision_of, to_precision
    from treespec.recipes import Recipe, run
    from treespec.calibrate.choices import resolve

    k = args.engine
    target, tok = load(DEFAULT_TARGET, dtype="bfloat16", role="target")
    base, _ = load(DEFAULT_DRAFT, dtype="float32", role="draft")
    traced, _ = load(DEFAULT_DRAFT, dtype="auto", role="draft", traceable=True)
    precision = precision_of(traced)
    captured = resolve(Recipe(tree="sequoia", acceptance=default_acceptance(None, 0.0), compile=True), target,
                       [traced], cache_file=cache_root() / "profiles.json")
    del traced
    keep = torch.as_tensor(kept_tokens(calibration_counts(tok), k, base.lm_head.out_features))
    trimmed = copy.deepcopy(base)
    trimmed.lm_head = TrimmedHead(trimmed.lm_head, keep)
    names = {"full": "full-head", "trimmed": f"head-{k}"}
    wanted = list(names) if args.engine_draft == "both" else [args.engine_draft]
    drafts = {names[w]: to_precision(copy.deepcopy(base) if w == "full" else trimmed, precision) for w in wanted}
    del base, trimmed
    methods = [compare.treespec_method(lambda ids, n, d=d: run(captured.recipe, target, [d], ids, max_new_tokens=n),
                                       precision_of(target), name=name) for name, d in drafts.items()]
    # compiles, once, before the timed prompts: a prompt long enough for the compiled prefill chunk, and as many
    # new tokens as the timed calls (fewer would cap the tree: another shape, another runner)
    warmup = 'def add(a: int, b: int) -> int:\n    """Return the sum of a and b.\n\n    >>> add(2, 3)\n    5\n    """\n'
    for m in methods:
        m.run(tok(warmup)["input_ids"], 64)
    prompts = [(name, i, tok(dataset_prompts(name)[i])["input_ids"]) for name in ("humaneval", "lee-news")
               for i in (range(100, 110) if name == "humaneval" else range(10))]
    records_file = args.records or (args.out or Path("trimmed-head-engine.md")).with_suffix(".jsonl")
    records = compare.run(methods, prompts, 64, records_file, on_record=lambda r: print(
        f"  {r['dataset']}/{r['prompt']} {r['method']}: {r['tokens_per_second']:.2f} tok/s, tau {r['tau']:.2f}",
        flush=True))
    lines = [f"# The captured step with a trimmed draft head (K = {k}) against the full head "
             f"({machine('cpu')}, torch {torch.__version__})", "",
             f"Command: `python experiments/bench_trimmed_head.py --engine {k} --out {args.out}`. Recipe: "
             f"{captured.why}. Both drafts {precision}, built the same way from the float32 draft; 64 greedy tokens; "
             + ("methods interleaved per prompt" if args.engine_draft == "both" else
                "each draft in its own process (`--engine-draft full`, then `--engine-draft trimmed`), one after "
                "the other") + "; intervals: 95% bootstrap over prompts, paired.", "",
             "| dataset | full head tok/s | trimmed tok/s | tau full | tau trimmed | speedup (paired) | "
             "identical outputs |", "|---|---|---|---|---|---|---|"]
    for dataset in ("humaneval", "lee-news"):
        by = {name: {r["prompt"]: r for r in records if r["dataset"] == dataset and r["method"] == name}
              for name in names.values()}
        if not all(by.values()):
            continue  # the other draft's process has not run yet
        shared = sorted(set.intersection(*(set(v) for v in by.values())))
        full, cut = ([by[name][p] for p in shared] for name in names.values())
        speed = lambda rs: intervals.ratio_of_sums([r["tokens"] for r in rs], [r["seconds"] for r in rs])  # noqa: E731
        tau = lambda rs: sum(r["tokens"] for r in rs) / sum(r["steps"] for r in rs)  # noqa: E731
        ratio = intervals.ratio_of_sums([r["seconds"] for r in full], [r["seconds"] for r in cut])
        same = sum(a["output"] == b["output"] for a, b in zip(full, cut))
        lines.append(f"| {dataset} ({len(shared)} prompts) | {speed(full).fmt(2)} | {speed(cut).fmt(2)} | "
                     f"{tau(full):.2f} | {tau(cut):.2f} | {ratio.fmt(3)}x | {same}/{len(shared)} |")
    text = "\n".join(lines) + "\n"
    print(text)
    if args.out:
        args.out.write_text(text)
    return text


def main(argv: list[str] | None = None) -> str:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", type=Path, default=None, help="write the tables here (markdown)")
    ap.add_argument("--keep", default="16384,32768,65536", help="kept-token counts K, comma-separated")
    ap.add_argument("--widths", default="1,4")
    ap.add_argument("--depth", type=int, default=7, help="the projected chain's depth (the captured default's)")
    ap.add_argument("--verify-ms", type=float, default=163.0,
                    help="verification ms per step in the projection (experiments/results/cpu-fastest-zen4)")
    ap.add_argument("--engine", type=int, default=None, metavar="K",
                    help="measure the captured step with a K-token head against the full head instead")
    ap.add_argument("--engine-draft", choices=("full", "trimmed", "both"), default="both",
                    help="--engine: which draft(s) this process runs (both: interleaved, needs the memory of two)")
    ap.add_argument("--records", type=Path, default=None, help="--engine's per-prompt records (default: beside --out)")
    args = ap.parse_args(argv)
    torch._inductor.config.freezing = True
    if args.engine is not None:
        return engine(args)
    ks = [int(k) for k in args.keep.split(",")]
    widths = [int(w) for w in args.widths.split(",")]
    base, tok = load(DEFAULT_DRAFT, dtype="float32", role="draft")
    vocab = base.lm_head.out_features
    ids = lambda text: tok(text)["input_ids"]  # noqa: E731
    tasks, lee = humaneval_tasks(), _lee_articles()

    calibration = calibration_counts(tok)
    evaluation = {"code": np.concatenate([ids(t["prompt"] + t["canonical_solution"]) for t in tasks[100:]]),
                  "prose": np.concatenate([ids(a) for a in lee[:10]])}
    keeps = {k: kept_tokens(calibration, k, vocab) for k in ks}
    lines = [f"# A trimmed draft LM head (FR-Spec's lever) ({machine('cpu')}, torch {torch.__version__})", "",
             "Command: `python experiments/bench_trimmed_head.py --out experiments/results/trimmed-head-cpu.md`", "",
             f"Calibration corpus: {sum(calibration.values())} tokens, {len(calibration)} distinct; evaluation-like "
             f"text: code {len(evaluation['code'])} tokens, prose {len(evaluation['prose'])} tokens.", "",
             "## Coverage", "", "| K | share of vocabulary | code | prose |", "|---|---|---|---|"]
    for k, keep in keeps.items():
        lines.append(f"| {k} | {k / vocab:.3f} | {np.isin(evaluation['code'], keep).mean():.4f} | "
                     f"{np.isin(evaluation['prose'], keep).mean():.4f} |")
    print("\n".join(lines), flush=True)

    # agreement: teacher-forced argmax of the int4 draft (full head, and restricted to each kept set) vs the target
    target, _ = load(DEFAULT_TARGET, dtype="bfloat16", role="target")
    draft = quantize_int4(copy.deepcopy(base), 128)
    texts = {"code": [(t["prompt"], t["canonical_solution"]) for t in tasks[100:116]],
             "prose": [(a[: len(a) // 3], a[len(a) // 3:]) for a in lee[:8]]}
    hits = {name: {"full": 0, **{k: 0 for k in ks}} for name in texts}
    positions = {name: 0 for name in texts}
    with torch.inference_mode():
        for name, pairs in texts.items():
            for prompt, cont in pairs:
                p, c = ids(prompt), ids(cont)[:96]
                x = torch.tensor([p + c])
                sl = slice(len(p) - 1, len(p) + len(c) - 1)
                want = target(x).logits[0, sl].argmax(-1)
                logits = draft(x).logits[0, sl].float()
                hits[name]["full"] += int((logits.argmax(-1) == want).sum())
                for k, keep in keeps.items():
                    mask = torch.full((vocab,), float("-inf"))
                    mask[torch.as_tensor(keep)] = 0.0
                    hits[name][k] += int(((logits + mask).argmax(-1) == want).sum())
                positions[name] += len(c)
    agree = {name: {h: v / positions[name] for h, v in row.items()} for name, row in hits.items()}
    lines += ["", "## Agreement with the target (teacher-forced top-1)", "",
              f"Positions: code {positions['code']}, prose {positions['prose']}.", "",
              "| head | code | prose |", "|---|---|---|"]
    lines += [f"| {h if h == 'full' else f'K={h}'} | {agree['code'][h]:.3f} | {agree['prose'][h]:.3f} |"
              for h in ["full", *ks]]
    print("\n".join(lines[-len(ks) - 3:]), flush=True)
    del target

    # one compiled draft level, full head and trimmed heads
    lines += ["", "## One compiled draft level (int4, group 128)", "",
              "| head | " + " | ".join(f"w={w}" for w in widths) + " | first call |",
              "|---|" + "---|" * (len(widths) + 1)]
    level_ms = {}
    for head in ["full", *ks]:
        model = copy.deepcopy(base)
        if head != "full":
            model.lm_head = TrimmedHead(model.lm_head, torch.as_tensor(keeps[head]))
        model = quantize_int4(model, 128)
        time_it = levels.level_timer(model, compiled=True)
        cells, first = [], 0.0
        for w in widths:
            median, f = time_it(w)
            first = max(first, f)
            level_ms[head, w] = median * 1e3
            cells.append(f"{median * 1e3:.1f} ms")
        lines.append(f"| {head if head == 'full' else f'K={head}'} | " + " | ".join(cells) + f" | {first:.0f} s |")
        print(lines[-1], flush=True)
        del model
        torch._dynamo.reset()

    d = args.depth
    lines += ["", f"## Projection (NOT measured): a chain of depth {d}, verification {args.verify_ms:g} ms per step",
              "", "tau = (1 - a^(d+1)) / (1 - a) with a = the agreement above; step = d levels (w=1) + verification.",
              "",
              "| head | code tau | prose tau | step ms | code tok/s vs full | prose tok/s vs full |",
              "|---|---|---|---|---|---|"]

    def tau(a: float) -> float:
        return (1 - a ** (d + 1)) / (1 - a)

    step_full = d * level_ms["full", 1] + args.verify_ms
    for head in ["full", *ks]:
        step = d * level_ms[head, 1] + args.verify_ms
        rel = {name: tau(agree[name][head]) / tau(agree[name]["full"]) * step_full / step for name in texts}
        lines.append(f"| {head if head == 'full' else f'K={head}'} | {tau(agree['code'][head]):.2f} | "
                     f"{tau(agree['prose'][head]):.2f} | {step:.0f} | {rel['code']:.3f} | {rel['prose']:.3f} |")
    text = "\n".join(lines) + "\n"
    print("\n".join(lines[-len(ks) - 2:]), flush=True)
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(text)
    return text


if __name__ == "__main__":
    main()
