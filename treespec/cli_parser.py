"""The ``treespec`` command's arguments: one parser per command, and argument types that apply each rule's
owner (``treespec.core.checks``, ``SamplingParams``, ``treespec.common.device``), never a second copy of it; name
lists (trees, modes, verifiers, precisions) and defaults come from ``treespec.common.options``. Building the parser
imports neither torch nor transformers (``--help`` answers at once); a rule's owner is imported when an option it
checks is parsed. ``treespec.cli`` runs the parsed command."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any, Callable

from .bench.datasets import DATASETS
from .common.options import (CHOICES, CONTEXTS, DEFAULT_DRAFT, DEFAULT_TARGET, PROFILE_SIZES, STATIC_MODES, TREES,
                             TUNED_TREES, VERIFIER_NAMES)

#: ``--device``'s default, read as this machine's device when the options are parsed
AUTO_DEVICE = "cuda if available"


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


def _prompts_file(text: str) -> Path:
    """An argparse type: a prompts file that exists, refused while parsing (in a fraction of a second, not after
    the imports and the models' loading)."""
    path = Path(text)
    if not path.is_file():
        raise argparse.ArgumentTypeError(f"{text}: {'not a file' if path.exists() else 'no such file'}")
    return path


def _checks():
    """``treespec.core.checks``, imported when an option it checks is parsed (it imports torch)."""
    from .core import checks

    return checks


def _sampling(**field: Any) -> None:
    """``SamplingParams``' own check of one field (imported when parsed, as :func:`_checks`)."""
    from .core.sampling import SamplingParams

    SamplingParams(**field)


def _count(name: str, minimum: int = 1) -> Callable[[str], int]:
    return _arg(int, lambda v: _checks().check_int(name, v, minimum))


_budget = _arg(int, lambda v: _checks().check_budget(v))
_seed = _arg(int, lambda v: _checks().check_seed(v))
_temperature = _arg(float, lambda v: _sampling(temperature=v))
_top_p = _arg(float, lambda v: _sampling(top_p=v))
_top_k = _arg(int, lambda v: _sampling(top_k=v))


def _demo_prompt_count(n: int) -> None:
    if not 1 <= n <= 64:
        raise ValueError(f"the demo runs prompts 100-163 of its set (HumanEval, or ShareGPT turns with --chat): give "
                         f"1 to 64, got {n}")


_demo_prompts = _arg(int, _demo_prompt_count)


def _device(text: str) -> str:
    """An argparse type: a torch device of this machine (``cpu``, ``cuda``, ``cuda:1``, ...); :data:`AUTO_DEVICE`
    (the default, which argparse converts as given text) is ``cuda`` where this machine has one, else ``cpu``."""
    from .common.device import check_device, default_device

    if text == AUTO_DEVICE:
        return default_device()
    try:
        check_device(text)
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e)) from None
    return text


def add_model_options(p: argparse.ArgumentParser, several_drafts: bool = False) -> None:
    """The target, draft, device and precision options; ``several_drafts``: ``--draft`` repeats (generate), else the
    command runs one draft (a second ``--draft`` replaces the first, as options do)."""
    p.add_argument("--target", default=DEFAULT_TARGET, metavar="M",
                   help="target model: HF id, local dir, local .gguf file, or a built-in name "
                        f"(default: {DEFAULT_TARGET})")
    if several_drafts:
        p.add_argument("--draft", action="append", metavar="M",
                       help=f"draft model (repeatable; default: {DEFAULT_DRAFT} unless --ngram alone is asked)")
    else:
        p.add_argument("--draft", type=lambda name: [name], metavar="M",
                       help=f"draft model: HF id, local dir, local .gguf file, or a built-in name (default: "
                            f"{DEFAULT_DRAFT})")
    p.add_argument("--device", type=_device, default=AUTO_DEVICE,
                   help="torch device, e.g. cpu, cuda or cuda:1 (default: %(default)s)")
    p.add_argument("--dtype", choices=CHOICES["target"], default=None,
                   help="target precision; auto times float32 and bfloat16 here and keeps the faster, and for a "
                        "GGUF target (a built-in one or a .gguf file) on a CPU, generate and demo keep int4 on the "
                        "file's own 4-bit blocks instead where its tuned tree (or a pilot's choice, for trees a pilot "
                        "sizes) is predicted faster, or, for a set tree size (generate's --budget, --paths), where "
                        "it forwards that tree faster (decisions cached); "
                        "int4 (CPU) keeps a GGUF's own 4-bit blocks. Default: auto on CPU, bfloat16 on CUDA")
    p.add_argument("--draft-dtype", choices=CHOICES["draft"], default=None,
                   help="draft precision; int8 is dynamic int8 quantisation, int4 weight-only 4-bit (both CPU), "
                        "auto also times them. "
                        "Default: auto on CPU, bfloat16 on CUDA")


def add_sampling_options(p: argparse.ArgumentParser) -> None:
    p.add_argument("--temperature", type=_temperature, default=0.0, metavar="T", help="0 = greedy (default)")
    p.add_argument("--top-p", type=_top_p, default=1.0, metavar="P",
                   help="keep the fewest most likely tokens whose probability reaches P (default 1: all)")
    p.add_argument("--top-k", type=_top_k, default=0, metavar="K", help="keep the K most likely tokens (0: all)")


def _model_command(sub, name: str, out: str, out_help: str, **kwargs) -> argparse.ArgumentParser:
    """A subcommand with the model options and ``--out``."""
    p = sub.add_parser(name, **kwargs)
    add_model_options(p)
    p.add_argument("--out", type=Path, default=Path(out), help=f"{out_help} (default: {out})")
    return p


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="treespec", description="Exact tree-based speculative decoding for HuggingFace causal LMs.")
    parser.add_argument("--debug", action="store_true",
                        help="show the full traceback of an error (also: environment TREESPEC_DEBUG=1)")
    parser.add_argument("--version", action="version", version=_version(),
                        help="print treespec's version, and torch's and transformers', and exit")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for add in (_generate, _demo, _accept, _profile):
        add(sub)
    sub.add_parser("sweep", help="run a tree-budget sweep from a TOML config (see `treespec sweep --help`)",
                   add_help=False)
    return parser


def _version() -> str:
    """``treespec X (torch Y, transformers Z)``: the installed distributions, as a bug report wants them."""
    from importlib.metadata import PackageNotFoundError, version

    def of(name: str) -> str:
        try:
            return version(name)
        except PackageNotFoundError:
            return "not installed"
    return f"treespec {of('treespec')} (torch {of('torch')}, transformers {of('transformers')})"


def _generate(sub) -> None:
    g = sub.add_parser("generate", help="generate from a prompt with tree speculative decoding",
                       description="Generate with tree speculative decoding; streams the text, then prints "
                                   "tau, tokens/s and the accepted-length histogram.")
    src = g.add_mutually_exclusive_group(required=True)
    src.add_argument("--prompt", metavar="TEXT", help="the prompt text")
    src.add_argument("--prompt-file", type=_prompts_file, metavar="F",
                     help="a text file: one prompt per line (\\n inside a line is a newline, \\\\ a backslash; "
                          "--prompts-jsonl takes any text as it is)")
    src.add_argument("--prompts-jsonl", type=_prompts_file, metavar="F",
                     help="a JSONL file: one object with a 'prompt' per line; its other fields (an id, say) come "
                          "back in the prompt's JSON record under 'input'")
    add_model_options(g, several_drafts=True)
    g.add_argument("--ngram", action="store_true",
                   help="add the n-gram drafter over the running context; beside a draft model it reserves up to "
                        "4 of the budget's nodes, the tree gets the rest")
    g.add_argument("--tree", choices=TREES, default="sequoia", help="tree builder (default: sequoia)")
    add_builder_options(g)
    g.add_argument("--paths", default=None, metavar="JSON",
                   help="the static tree of --tree paths: child-rank paths in priority order (Medusa style: each "
                        "after its parent and its sibling of the rank below), as JSON, e.g. '[[0], [1], [0, 0]]', "
                        "or a JSON file holding that list; --budget B keeps its first B - 1 paths (default: all)")
    g.add_argument("--budget", type=_budget, default=None, metavar="B",
                   help="tokens per verification pass, root included. Default: for a Sequoia, chain or kary "
                        "tree with one draft model (no --ngram), that tree's budget and depth (and a Sequoia tree's "
                        "width) predicted fastest on this machine (profile cached under the treespec cache); "
                        "otherwise the depth a short pilot measures fastest here, or plain decoding when no depth pays "
                        "(cached too)")
    g.add_argument("--depth", type=_count("depth"), default=None, metavar="D", help="maximum tree depth")
    g.add_argument("--acceptance", type=Path, default=None, metavar="JSON",
                   help="acceptance for --tree sequoia, and for a chain or kary tree without --budget (from "
                        "`treespec accept`; default: the one shipped for the built-in pair); its per-depth rows size "
                        "the tree unless --positional-acceptance")
    g.add_argument("--positional-acceptance", action="store_true",
                   help="size the Sequoia tree from the positional vector (Sequoia's published model: the same "
                        "acceptance at every depth) instead of the per-depth rows")
    g.add_argument("--draft-mode", choices=STATIC_MODES, default=None,
                   help="how model drafters pick children (default: topk when greedy; when sampling "
                        "sample_without_replacement, or sample for --tree chains)")
    add_sampling_options(g)
    g.add_argument("--max-new-tokens", type=_count("max-new-tokens"), default=128, metavar="N",
                   help="tokens to generate per prompt (default 128; fewer where an EOS comes first)")
    g.add_argument("--seed", type=_seed, default=None, metavar="S",
                   help="random seed of a sampled run: the first prompt runs with S, each other with a seed derived "
                        "from S and its place in the prompt list, so its output does not depend on --batch-size or "
                        "on a resumed --out (default: a random seed per prompt)")
    add_chat_option(g)
    g.add_argument("--verifier", choices=VERIFIER_NAMES, default="rrs",
                   help="exact verification rule for sampled steps (docs/verifiers.md; default rrs)")
    g.add_argument("--compile", nargs="?", const=True, default=None, metavar="BACKEND",
                   help="compiled static-shape steps (optionally naming the torch.compile backend, or "
                        "'uncompiled': the same steps as plain PyTorch, for debugging): one draft model's static "
                        "tree is drafted on the device too (captured; the draft is loaded in a precision "
                        "torch.compile traces); other drafters draft on the host. Pays a compile (1-2 minutes on a "
                        "CPU the first time). Default: compiled when measured here to pay back its compile for "
                        "this run's prompts x --max-new-tokens (measured for runs of 4096+ new tokens, cached)")
    g.add_argument("--no-compile", dest="compile", action="store_const", const=False,
                   help="eager steps, without measuring whether compiling pays")
    g.add_argument("--json", action="store_true",
                   help="print one JSON object per prompt (new_tokens, steps, tau, seconds, tokens_per_second, "
                        "configuration, the recipe with the tree drafted as child-rank paths) instead of streaming "
                        "text")
    g.add_argument("--out", type=Path, default=None, metavar="F",
                   help="append each prompt's JSON record (what --json prints, with the prompt's index and the "
                        "settings) to the JSONL file F as soon as the prompt is done; run the same command again "
                        "to generate only the prompts F does not hold yet (F of other settings is refused)")
    g.add_argument("--compare", action="store_true",
                   help="also run the target alone (HF generate) and compare speed and output, after one untimed "
                        "warm-up of each on the longest prompt (a compiled step compiles there); greedy outputs "
                        "that differ anywhere but at a tie of the target's top two logits exit with status 1")
    g.add_argument("--batch-size", type=_count("batch-size"), default=1, metavar="B",
                   help="decode the prompts B at a time, each batch in one target forward per step (eager steps, "
                        "or the captured step with --compile; every row exact as if alone; default 1)")


def add_builder_options(p: argparse.ArgumentParser) -> None:
    """The options of the k-ary and independent-chains builders (refused with another ``--tree``)."""
    p.add_argument("--kary-width", type=_count("kary-width"), default=None, metavar="K",
                   help="children per node of --tree kary (SpecInfer's k-ary tree; default 2)")
    p.add_argument("--chains", type=_count("chains"), default=None, metavar="K",
                   help="independent chains of --tree chains (default 2 up to budget 16, else 4)")


def add_chat_option(p: argparse.ArgumentParser) -> None:
    p.add_argument("--chat", action="store_true",
                   help="wrap each prompt in the tokenizer's chat template as a user turn (generate: a tuned tree is "
                        "then sized from the acceptance shipped for chat turns, unless --acceptance is given; accept: "
                        "measure with --chat what you will generate with it, a template changes what the draft sees)")


def _demo(sub) -> None:
    d = _model_command(sub, "demo", "treespec-demo", "where the report and tree PNG go",
                       help="the main job: the default pair on HumanEval, treespec vs the target alone",
                       description="Load the default model pair, size a tree for this machine, run a few "
                                   "HumanEval prompts with the target alone and with treespec, and report.")
    d.add_argument("--prompts", type=_demo_prompts, default=3, metavar="N",
                   help="prompts from 100 on: HumanEval's, or ShareGPT's with --chat (1 to 64; default 3)")
    d.add_argument("--max-new-tokens", type=_count("max-new-tokens"), default=64, metavar="N",
                   help="tokens each method generates per prompt (default 64)")
    d.add_argument("--chat", action="store_true",
                   help="run ShareGPT first turns (from 100 on) as user turns in the chat template instead, the tree "
                        "sized from the acceptance shipped for chat turns (what a chat user sends)")
    d.add_argument("--quick", action="store_true",
                   help="run HF generate eager only (not HF with a static cache + torch.compile, nor HF assisted): "
                        "a shorter first run, labelled as such")


def _accept(sub) -> None:
    a = _model_command(sub, "accept", "acceptance.json", "the JSON file written; until then each prompt's "
                       "measurement is kept in OUT.parts.jsonl as it is made, so a stopped run, run again with the "
                       "same settings, measures only the others",
                       help="measure a draft's positional acceptance vector",
                       description="Measure the positional acceptance vector (and per-depth matrix, beta) of "
                                   "a draft against the target along the verification walk, on continuations of "
                                   "calibration prompts (HumanEval by default, another built-in set, or your own) "
                                   "distributed as the target's own; writes JSON usable by --acceptance (it keeps "
                                   "every position's rank, so MeasuredAcceptance.replayed_tau can run a tree over "
                                   "it).")
    calib = a.add_mutually_exclusive_group()
    calib.add_argument("--calib", default="0:20", metavar="A:B", help="prompts A..B-1 of --dataset (default 0:20; keep "
                       "them disjoint from the prompts you evaluate on, e.g. HumanEval's 100-163)")
    calib.add_argument("--prompt-file", type=_prompts_file, metavar="F",
                       help="calibrate on your own prompts instead: a text file, one prompt per line (prompts like "
                            "the ones you will generate from, but not the same ones)")
    calib.add_argument("--prompts-jsonl", type=_prompts_file, metavar="F",
                       help="calibrate on your own prompts instead: a JSONL file, one object with a 'prompt' per line")
    a.add_argument("--dataset", choices=DATASETS, default=None,
                   help="the built-in prompts --calib ranges over: humaneval (code, the default), lee-news (news "
                        "prose; pip install gensim) or sharegpt (chat first turns: with --chat, as a chat user sends "
                        "them)")
    a.add_argument("--width", type=_count("width"), default=8, help="proposals per position (vector length)")
    a.add_argument("--mode", choices=STATIC_MODES, default=None,
                   help="how the draft proposes (default: topk when greedy, else sample_without_replacement)")
    add_sampling_options(a)
    add_chat_option(a)
    a.add_argument("--max-new-tokens", type=_count("max-new-tokens"), default=48, metavar="N",
                   help="tokens walked per prompt (default 48)")
    a.add_argument("--max-depth", type=_count("max-depth"), default=8, metavar="D", help="rows of the per-depth matrix")
    a.add_argument("--batch-size", type=_count("batch-size"), default=8, metavar="B",
                   help="prompts walked together, as the rows of one forward per position (default 8; each prompt's "
                        "walk is the one it has alone)")
    a.add_argument("--context", choices=CONTEXTS, default="walk",
                   help="how the continuation is written: 'walk' (default: by the acceptance rule, one token at a "
                        "time, so an accepted child is the next context and both models run as a step runs them) "
                        "or 'target' (the target alone, scored in one teacher-forced forward: cheaper, and it "
                        "underrates a draft whose int8 activations share one scale per forward)")


def _profile(sub) -> None:
    pr = _model_command(sub, "profile", "profile.json", "the JSON file written",
                        help="measure latencies and pick a tree for this machine",
                        description="Measure the target's tree-forward latency per tree size and the draft's cost "
                                    "per level width, then pick the Sequoia tree (budget, depth, width limit), or with "
                                    "--tree chain / kary that builder's tree (budget, depth), with the most predicted "
                                    "tokens per second: G(T) / (t(n) + the draft forwards of its levels at their "
                                    "widths + the engine's time per step).")
    pr.add_argument("--sizes", type=_count("size"), nargs="+", default=list(PROFILE_SIZES), metavar="N",
                    help="tree sizes (tokens per target forward) to time; the largest caps the budgets chosen "
                         f"from (default: {' '.join(map(str, PROFILE_SIZES))}, what generate's tuner times)")
    pr.add_argument("--acceptance", type=Path, default=None, metavar="JSON",
                    help="acceptance (default: the one shipped for the built-in pair); its per-depth rows unless "
                         "--positional-acceptance")
    pr.add_argument("--positional-acceptance", action="store_true",
                    help="the positional vector instead of the per-depth rows")
    pr.add_argument("--max-depth", type=_count("max-depth"), default=8, metavar="D",
                    help="the deepest tree chosen from (default 8)")
    pr.add_argument("--tree", choices=TUNED_TREES, default="sequoia",
                    help="the builder whose trees are sized (default: sequoia)")
    pr.add_argument("--kary-width", type=_count("kary-width"), default=None, metavar="K",
                    help="children per node of --tree kary (default 2)")
