"""The ``treespec`` command: generate, demo, accept, profile, sweep.

Options become a :class:`~treespec.recipes.Recipe` right after parsing (so a bad setting fails
before any model loads), and every command runs it through ``treespec.recipes`` like any API user.
Argument types apply the rule's owner (``treespec.core.checks``, ``SamplingParams``), never a
second copy of it; name lists (trees, modes, verifiers, precisions) come from their owners.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path
from typing import Any, Callable, Sequence

import torch

from .calibrate.acceptance import CONTEXTS
from .calibrate.vectors import default_acceptance
from .common.files import check_writable
from .core import checks
from .core.sampling import SamplingParams
from .core.verifiers import VERIFIERS
from .drafters.model import STATIC_MODES
from .models.pair import eos_ids, load_pair
from .models.precision import CHOICES
from .recipes import TREES, NGramSettings, Recipe, draft_mode, run
from .calibrate.choices import resolve, resolve_compile


def _arg(convert: Callable[[str], Any], check: Callable[[Any], Any]) -> Callable[[str], Any]:
    """An argparse type: ``convert(text)``, then the rule's own ``check`` (its ValueError is the message)."""
    def parse(text: str):
        value = convert(text)
        try:
            check(value)
        except ValueError as error:
            raise argparse.ArgumentTypeError(str(error)) from None
        return value

    parse.__name__ = convert.__name__  # argparse names the type in its "invalid value" message
    return parse


def _count(name: str, minimum: int = 1) -> Callable[[str], int]:
    return _arg(int, lambda v: checks.check_int(name, v, minimum))


_budget = _arg(int, checks.check_budget)
_seed = _arg(int, checks.check_seed)
_temperature = _arg(float, lambda v: SamplingParams(temperature=v))
_top_p = _arg(float, lambda v: SamplingParams(top_p=v))
_top_k = _arg(int, lambda v: SamplingParams(top_k=v))


def _demo_prompt_count(n: int) -> None:
    if not 1 <= n <= 64:
        raise ValueError(f"the demo runs HumanEval prompts 100-163: give 1 to 64, got {n}")


_demo_prompts = _arg(int, _demo_prompt_count)


def _device(text: str) -> str:
    """An argparse type: a torch device name (``cpu``, ``cuda``, ``cuda:1``, ...)."""
    try:
        torch.device(text)
    except (RuntimeError, ValueError):
        raise argparse.ArgumentTypeError(f"not a torch device: {text!r} (e.g. cpu, cuda, cuda:1)") from None
    return text


def add_model_options(p: argparse.ArgumentParser) -> None:
    from .models.loading import DEFAULT_DRAFT, DEFAULT_TARGET

    p.add_argument("--target", default=DEFAULT_TARGET, metavar="M",
                   help=f"target model: HF id, local dir, or a built-in name (default: {DEFAULT_TARGET})")
    p.add_argument("--draft", action="append", metavar="M",
                   help=f"draft model (repeatable; default: {DEFAULT_DRAFT} unless --ngram alone is asked)")
    p.add_argument("--device", type=_device, default="cuda" if torch.cuda.is_available() else "cpu",
                   help="torch device, e.g. cpu, cuda or cuda:1 (default: cuda if available)")
    p.add_argument("--dtype", choices=CHOICES["target"], default=None,
                   help="target precision; auto times float32 and bfloat16 here and keeps the faster (the "
                        "decision is cached). Default: auto on CPU, bfloat16 on CUDA")
    p.add_argument("--draft-dtype", choices=CHOICES["draft"], default=None,
                   help="draft precision; int8 is dynamic int8 quantisation, int4 weight-only 4-bit (both CPU), "
                        "auto also times them. "
                        "Default: auto on CPU, bfloat16 on CUDA")


def add_sampling_options(p: argparse.ArgumentParser) -> None:
    p.add_argument("--temperature", type=_temperature, default=0.0, metavar="T", help="0 = greedy (default)")
    p.add_argument("--top-p", type=_top_p, default=1.0, metavar="P")


def load_models(args: argparse.Namespace, want_draft: bool = True):
    """Target, its tokenizer and the draft models the options ask for (default draft unless none is wanted)."""
    from .models import DEFAULT_DRAFT

    names = args.draft if args.draft else ([DEFAULT_DRAFT] if want_draft else [])
    return load_pair(args.target, names, device=args.device, target_dtype=args.dtype,
                     draft_dtype=getattr(args, "draft_dtype", None), compile=getattr(args, "compile", None) or False)


def _model_command(sub, name: str, func, out: str, out_help: str, **kwargs) -> argparse.ArgumentParser:
    """A subcommand with the model options, ``--out`` and its function."""
    p = sub.add_parser(name, **kwargs)
    add_model_options(p)
    p.add_argument("--out", type=Path, default=Path(out), help=f"{out_help} (default: {out})")
    p.set_defaults(func=func)
    return p


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="treespec", description="Exact tree-based speculative decoding for HuggingFace causal LMs.")
    parser.add_argument("--debug", action="store_true",
                        help="show the full traceback of an error (also: environment TREESPEC_DEBUG=1)")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    g = sub.add_parser("generate", help="generate from a prompt with tree speculative decoding",
                       description="Generate with tree speculative decoding; streams the text, then prints "
                                   "tau, tokens/s and the accepted-length histogram.")
    src = g.add_mutually_exclusive_group(required=True)
    src.add_argument("--prompt", metavar="TEXT", help="the prompt text")
    src.add_argument("--prompt-file", type=Path, metavar="F", help="a text file: one prompt per line (\\n inside a line is a newline)")
    src.add_argument("--prompts-jsonl", type=Path, metavar="F", help="a JSONL file: one object with a 'prompt' per line")
    add_model_options(g)
    g.add_argument("--ngram", action="store_true",
                   help="add the n-gram drafter over the running context; beside a draft model it reserves up to "
                        "4 of the budget's nodes, the tree gets the rest")
    g.add_argument("--tree", choices=TREES, default="sequoia", help="tree builder (default: sequoia)")
    g.add_argument("--budget", type=_budget, default=None, metavar="B",
                   help="tokens per verification pass, root included. Default: for a Sequoia tree with one "
                        "draft model, the budget, depth and width measured fastest on this machine (profile "
                        "cached under the treespec cache); otherwise the depth a short pilot measures fastest here, or "
                        "plain decoding when no depth pays (cached too)")
    g.add_argument("--depth", type=_count("depth"), default=None, metavar="D", help="maximum tree depth")
    g.add_argument("--acceptance", type=Path, default=None, metavar="JSON",
                   help="acceptance for --tree sequoia (from `treespec accept`; default: the one shipped for the "
                        "built-in pair); its per-depth rows size the tree unless --positional-acceptance")
    g.add_argument("--positional-acceptance", action="store_true",
                   help="size the Sequoia tree from the positional vector (Sequoia's published model: the same "
                        "acceptance at every depth) instead of the per-depth rows")
    g.add_argument("--draft-mode", choices=STATIC_MODES, default=None,
                   help="how model drafters pick children (default: topk when greedy; when sampling "
                        "sample_without_replacement, or sample for --tree chains)")
    add_sampling_options(g)
    g.add_argument("--top-k", type=_top_k, default=0, metavar="K", help="keep the K most likely tokens (0: all)")
    g.add_argument("--max-new-tokens", type=_count("max-new-tokens"), default=128, metavar="N")
    g.add_argument("--seed", type=_seed, default=None, metavar="S", help="random seed (default: a random one)")
    g.add_argument("--chat", action="store_true", help="wrap the prompt in the tokenizer's chat template")
    g.add_argument("--verifier", choices=tuple(VERIFIERS), default="rrs",
                   help="exact verification rule for sampled steps (docs/verifiers.md; default rrs)")
    g.add_argument("--compile", nargs="?", const=True, default=None, metavar="BACKEND",
                   help="compiled static-shape steps (optionally naming the torch.compile backend): one draft model's "
                        "static tree is drafted on the device too (captured; the draft is loaded in a precision "
                        "torch.compile traces); other drafters draft on the host. Pays a compile (1-2 minutes on a "
                        "CPU the first time). Default: compiled when measured here to pay back its compile for "
                        "this run's prompts x --max-new-tokens (measured for runs of 4096+ new tokens, cached)")
    g.add_argument("--no-compile", dest="compile", action="store_const", const=False,
                   help="eager steps, without measuring whether compiling pays")
    g.add_argument("--json", action="store_true",
                   help="print one JSON object per prompt (new_tokens, steps, tau, seconds, tokens_per_second, "
                        "configuration) instead of streaming text")
    g.add_argument("--compare", action="store_true",
                   help="also run the target alone (HF generate) and compare speed and output")
    g.set_defaults(func=cmd_generate)

    d = _model_command(sub, "demo", cmd_demo, "treespec-demo", "where the report and tree PNG go",
                       help="the main job: the default pair on HumanEval, treespec vs the target alone",
                       description="Load the default model pair, size a tree for this machine, run a few "
                                   "HumanEval prompts with the target alone and with treespec, and report.")
    d.add_argument("--prompts", type=_demo_prompts, default=3, metavar="N",
                   help="HumanEval prompts from 100 on (1 to 64; default 3)")
    d.add_argument("--max-new-tokens", type=_count("max-new-tokens"), default=64, metavar="N")

    a = _model_command(sub, "accept", cmd_accept, "acceptance.json", "the JSON file written",
                       help="measure a draft's positional acceptance vector",
                       description="Measure the positional acceptance vector (and per-depth matrix, beta) of "
                                   "a draft against the target along the verification walk, on continuations of "
                                   "calibration prompts (HumanEval by default, or your own) distributed as the "
                                   "target's own; writes JSON usable by --acceptance (it keeps every position's "
                                   "rank, so MeasuredAcceptance.replayed_tau can run a tree over it).")
    calib = a.add_mutually_exclusive_group()
    calib.add_argument("--calib", default="0:20", metavar="A:B", help="HumanEval prompts A..B-1 (default 0:20; keep "
                       "them disjoint from the prompts you evaluate on, e.g. 100-163)")
    calib.add_argument("--prompt-file", type=Path, metavar="F",
                       help="calibrate on your own prompts instead: a text file, one prompt per line (prompts like "
                            "the ones you will generate from, but not the same ones)")
    calib.add_argument("--prompts-jsonl", type=Path, metavar="F",
                       help="calibrate on your own prompts instead: a JSONL file, one object with a 'prompt' per line")
    a.add_argument("--width", type=_count("width"), default=8, help="proposals per position (vector length)")
    a.add_argument("--mode", choices=STATIC_MODES, default=None,
                   help="how the draft proposes (default: topk when greedy, else sample_without_replacement)")
    add_sampling_options(a)
    a.add_argument("--max-new-tokens", type=_count("max-new-tokens"), default=48, metavar="N")
    a.add_argument("--max-depth", type=_count("max-depth"), default=8, metavar="D", help="rows of the per-depth matrix")
    a.add_argument("--context", choices=CONTEXTS, default="walk",
                   help="how the continuation is written: 'walk' (default: by the acceptance rule, one token at a "
                        "time, so an accepted child is the next context and both models run as a step runs them) "
                        "or 'target' (the target alone, scored in one teacher-forced forward: cheaper, and it "
                        "underrates a draft whose int8 activations share one scale per forward)")

    pr = _model_command(sub, "profile", cmd_profile, "profile.json", "the JSON file written",
                        help="measure latencies and pick a tree for this machine",
                        description="Measure the target's tree-forward latency per tree size and the draft's cost "
                                    "per level width, then pick the Sequoia tree (budget, depth, width limit) with the "
                                    "most predicted tokens per second: G(T) / (t(n) + the draft forwards of its levels "
                                    "at their widths + the engine's time per step).")
    pr.add_argument("--sizes", type=_count("size"), nargs="+", default=[1, 2, 4, 8, 16, 32], metavar="N")
    pr.add_argument("--acceptance", type=Path, default=None, metavar="JSON",
                    help="acceptance (default: the one shipped for the built-in pair); its per-depth rows unless "
                         "--positional-acceptance")
    pr.add_argument("--positional-acceptance", action="store_true",
                    help="the positional vector instead of the per-depth rows")
    pr.add_argument("--max-depth", type=_count("max-depth"), default=8, metavar="D")

    sub.add_parser("sweep", help="run a tree-budget sweep from a TOML config (see `treespec sweep --help`)",
                   add_help=False)
    return parser


def recipe_from_args(args: argparse.Namespace, with_model: bool = True) -> Recipe:
    """The recipe ``treespec generate`` runs for its options (``--budget`` absent: None, resolved later)."""
    sequoia = args.tree == "sequoia" and with_model
    return Recipe(tree=args.tree, budget=args.budget, depth=args.depth, temperature=args.temperature,
                  top_k=args.top_k, top_p=args.top_p, draft_mode=args.draft_mode,
                  ngram=NGramSettings() if args.ngram else None,
                  acceptance=default_acceptance(args.acceptance, args.temperature,
                                                per_depth=not args.positional_acceptance) if sequoia else None,
                  target_dtype=args.dtype, draft_dtype=args.draft_dtype, verifier=args.verifier,
                  compile=args.compile or False)  # None (decided after resolving, resolve_compile): eager until then


def read_prompts(args: argparse.Namespace) -> list[str]:
    """``--prompt``, the lines of ``--prompt-file`` (blank lines skipped) or the ``prompt`` fields of ``--prompts-jsonl``."""
    if getattr(args, "prompt", None) is not None:
        return [args.prompt]
    if args.prompt_file is not None:
        prompts = [line.replace("\\n", "\n") for line in args.prompt_file.read_text().splitlines() if line.strip()]
        where = args.prompt_file
    else:
        where = args.prompts_jsonl
        prompts = []
        for n, line in enumerate(where.read_text().splitlines(), start=1):
            if not line.strip():
                continue
            try:
                record = json.loads(line)
                prompts.append(record["prompt"])
            except (json.JSONDecodeError, KeyError, TypeError):
                raise ValueError(f"{where}, line {n}: expected a JSON object with a \"prompt\" string") from None
            if not isinstance(prompts[-1], str):
                raise ValueError(f"{where}, line {n}: \"prompt\" must be a string")
    if not prompts:
        raise ValueError(f"{where} holds no prompt")
    return prompts


def encode(tok, text: str, chat: bool) -> list[int]:
    if chat:
        return tok.apply_chat_template([{"role": "user", "content": text}], add_generation_prompt=True,
                                       tokenize=True, return_dict=False)
    return tok(text)["input_ids"]


class Streamer:
    """Prints the decoded text as tokens are committed."""

    def __init__(self, tok, out=sys.stdout) -> None:
        self.tok, self.out, self.ids, self.printed = tok, out, [], 0

    def __call__(self, tokens: list[int]) -> None:
        self.ids += tokens
        text = self.tok.decode(self.ids, skip_special_tokens=True)
        self.out.write(text[self.printed :])
        self.out.flush()
        self.printed = len(text)


def histogram(hist: list[int], width: int = 40) -> str:
    top = max(hist) if hist else 1
    return "\n".join(f"  {k:>3} | {'#' * max(1, round(width * n / top)) if n else '':<{width}} {n}"
                     for k, n in enumerate(hist))


def _print_stats(s) -> None:
    print("\n" + "-" * 60)
    print(f"treespec: {s.new_tokens} tokens in {s.seconds:.2f} s = {s.tokens_per_second:.2f} tok/s, "
          f"{s.steps} steps, tau {s.tau:.2f}" + ("" if s.step == "eager" else f"; step: {s.step}"))
    print(f"time: prefill {s.prefill_seconds:.2f} s, drafting {s.drafting_seconds:.2f} s, "
          f"verifying {s.verifying_seconds:.2f} s, engine {s.overhead_seconds:.2f} s")
    for d in s.drafters:
        print(f"drafter {d.name}: {d.accepted} of {d.proposed} proposals committed")
    print("accepted drafted tokens per step:\n" + histogram(s.accepted_hist))


def _compare(args: argparse.Namespace, recipe: Recipe, target, ids: list[int], eos: list[int], out,
             record: dict[str, Any]) -> bool:
    """``--compare``: the target alone (HF generate) on the same prompt; False if greedy outputs differ."""
    from .bench.baselines import hf_generate

    ref, secs = hf_generate(target, ids, args.max_new_tokens, temperature=recipe.temperature, top_p=recipe.top_p,
                            top_k=recipe.top_k, eos_token_id=eos, pad_token_id=(eos or [0])[0], seed=args.seed)
    record.update(hf_tokens_per_second=len(ref) / secs, speedup=out.stats.tokens_per_second / (len(ref) / secs))
    if recipe.temperature == 0:
        record["identical"] = ref == out.new_tokens
    if not args.json:
        print(f"target alone (HF generate): {len(ref)} tokens in {secs:.2f} s = {len(ref) / secs:.2f} tok/s")
        print(f"speedup: {record['speedup']:.2f}x")
        if "identical" in record:
            print(f"greedy outputs identical: {'yes' if record['identical'] else 'NO'}")
    return record.get("identical", True)


def cmd_generate(args: argparse.Namespace) -> int:
    prompts = read_prompts(args)
    want_draft = not (args.ngram and not args.draft)
    recipe = recipe_from_args(args, with_model=want_draft)  # validates before the models load
    target, tok, drafts = load_models(args, want_draft)
    resolved = resolve(recipe, target, drafts, tokenizer=tok, max_new_tokens=args.max_new_tokens)
    if args.compile is not False:  # by measurement, or as asked (a cached measurement still costs the why-line)
        resolved = resolve_compile(resolved, target, drafts, tok, prompts=len(prompts),
                                   max_new_tokens=args.max_new_tokens, backend=args.compile or True,
                                   asked=args.compile is not None)
    recipe = resolved.recipe
    print(f"configuration: {resolved.why}", file=sys.stderr if args.json else sys.stdout, flush=True)
    eos = eos_ids(target, tok)
    status = 0
    for text in prompts:
        ids = encode(tok, text, args.chat)
        out = run(recipe, target, drafts, ids, max_new_tokens=args.max_new_tokens, seed=args.seed,
                  eos_token_id=eos, on_tokens=None if args.json else Streamer(tok))
        record = {"prompt": text, **out.stats.record(), "new_tokens": out.new_tokens,
                  "text": tok.decode(out.new_tokens, skip_special_tokens=True), "configuration": resolved.why,
                  "recipe": {"tree": recipe.tree, "budget": recipe.budget, "depth": recipe.depth,
                             "max_width": recipe.max_width, "verifier": recipe.verifier, "compile": recipe.compile,
                             "target_dtype": recipe.target_dtype, "draft_dtype": recipe.draft_dtype}}
        if not args.json:
            _print_stats(out.stats)
        if args.compare and not _compare(args, recipe, target, ids, eos, out, record):
            status = 1
        if args.json:
            print(json.dumps(record), flush=True)
    return status


def cmd_demo(args: argparse.Namespace) -> int:
    from .bench.demo import run_demo

    check_writable(args.out, directory=True)  # fail now, not after minutes of loading and profiling
    print("loading the target and the draft (the first run builds the model cache: a few minutes) ...", flush=True)
    target, tok, drafts = load_models(args)
    return run_demo(args, target, tok, drafts[0])


def cmd_accept(args: argparse.Namespace) -> int:
    from .bench.datasets import dataset_size, humaneval_prompts, prompt_range
    from .calibrate.acceptance import encode_prompts, measure

    if args.prompt_file is not None or args.prompts_jsonl is not None:
        texts = read_prompts(args)
        label = f"{(args.prompt_file or args.prompts_jsonl).name} ({len(texts)} prompts)"
    else:
        start, stop = prompt_range(args.calib, dataset_size("humaneval"), "--calib")
        texts, label = humaneval_prompts(start, stop), f"humaneval[{start}:{stop}]"
    check_writable(args.out)  # fail now, not after minutes of measuring
    target, tok, drafts = load_models(args)
    mode = draft_mode("sequoia", args.temperature, args.mode)
    acc = measure(target, drafts[0], encode_prompts(tok, texts), width=args.width,
                  mode=mode, temperature=args.temperature, top_p=args.top_p, max_new_tokens=args.max_new_tokens,
                  max_depth=args.max_depth, prompts_label=label, context=args.context)
    acc.save(args.out)
    print(acc)
    print(f"written to {args.out}")
    return 0


def cmd_profile(args: argparse.Namespace) -> int:
    from .calibrate.costs import profile

    acceptance = default_acceptance(args.acceptance, 0.0, per_depth=not args.positional_acceptance)
    check_writable(args.out)  # fail now, not after minutes of profiling
    target, _, drafts = load_models(args)
    prof = profile(target, drafts[0], sizes=args.sizes)
    choice = prof.choose(acceptance, budgets=list(range(2, max(args.sizes) + 1)),
                         max_depth=args.max_depth)
    t1 = prof.target_latency[1]
    print("tree size | target forward s | relative to 1 token")
    for n, t in sorted(prof.target_latency.items()):
        print(f"{n:>9} | {t:>16.3f} | {t / t1:.2f}")
    widths = ", ".join(f"{w} tokens {s:.3f} s" for w, s in sorted((prof.draft_level_latency or {}).items()))
    print(f"draft forward per level: {widths} (c = {choice.c:.2f})")
    print(f"best: {choice}\n{choice.shape}")
    prof.save(args.out)
    print(f"written to {args.out}")
    return 0


#: errors a user can cause (bad option values and files, raised as ValueError where they are read; missing or
#: unreadable files and models; a missing optional package): no traceback. Anything else (a TypeError, a
#: KeyError, ...) is a programming error and keeps its traceback.
USER_ERRORS = (ValueError, OSError, ImportError)


def main(argv: Sequence[str] | None = None) -> int:
    """Run the ``treespec`` command; user errors print ``treespec: error: ...`` and return 2.

    ``--debug`` or ``TREESPEC_DEBUG=1`` re-raises them with their traceback.
    """
    argv = list(sys.argv[1:] if argv is None else argv)
    debug = os.environ.get("TREESPEC_DEBUG", "") not in ("", "0") or "--debug" in argv
    argv = [a for a in argv if a != "--debug"]
    try:
        if argv and argv[0] == "sweep":
            from .bench.sweep.cli import main as sweep_main

            return sweep_main(argv[1:]) or 0
        args = build_parser().parse_args(argv)
        return args.func(args)
    except USER_ERRORS as error:
        if debug:
            raise
        print(f"treespec: error: {error}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        if debug:
            raise
        print("treespec: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
