"""The ``treespec`` command: generate, demo, accept, profile, sweep."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Sequence

import torch

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
TREES = ("sequoia", "chain", "kary", "chains", "dynamic")


def _positive_int(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be an integer >= 1, got {text}")
    return value


def _budget(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(
            f"budget must be >= 1 (tokens per verification pass, root included), got {text}")
    return value


def _temperature(text: str) -> float:
    value = float(text)
    if value < 0:
        raise argparse.ArgumentTypeError(f"temperature must be >= 0 (0 is greedy), got {text}")
    return value


def _top_p(text: str) -> float:
    value = float(text)
    if not 0 < value <= 1:
        raise argparse.ArgumentTypeError(f"top-p must be in (0, 1], got {text}")
    return value


def add_model_options(p: argparse.ArgumentParser) -> None:
    from .models import DEFAULT_DRAFT, DEFAULT_TARGET

    p.add_argument("--target", default=DEFAULT_TARGET, metavar="M",
                   help=f"target model: HF id, local dir, or a built-in name (default: {DEFAULT_TARGET})")
    p.add_argument("--draft", action="append", metavar="M",
                   help=f"draft model (repeatable; default: {DEFAULT_DRAFT} unless --ngram alone is asked)")
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--dtype", choices=list(DTYPES), default=None,
                   help="model dtype (default: float32 on CPU, bfloat16 on CUDA)")


def dtype_for(args: argparse.Namespace) -> torch.dtype:
    if args.dtype:
        return DTYPES[args.dtype]
    return torch.bfloat16 if str(args.device).startswith("cuda") else torch.float32


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="treespec", description="Exact tree-based speculative decoding for HuggingFace causal LMs.")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    g = sub.add_parser("generate", help="generate from a prompt with tree speculative decoding",
                       description="Generate with tree speculative decoding; streams the text, then prints "
                                   "tau, tokens/s and the accepted-length histogram.")
    src = g.add_mutually_exclusive_group(required=True)
    src.add_argument("--prompt", metavar="TEXT", help="the prompt text")
    src.add_argument("--prompt-file", type=Path, metavar="F", help="read the prompt from a file")
    add_model_options(g)
    g.add_argument("--ngram", action="store_true", help="add the n-gram drafter over the running context")
    g.add_argument("--tree", choices=TREES, default="sequoia", help="tree builder (default: sequoia)")
    g.add_argument("--budget", type=_budget, default=16, metavar="B",
                   help="tokens per verification pass, root included (default: 16)")
    g.add_argument("--depth", type=_positive_int, default=None, metavar="D", help="maximum tree depth")
    g.add_argument("--acceptance", type=Path, default=None, metavar="JSON",
                   help="acceptance vector for --tree sequoia (from `treespec accept`; default: the "
                        "vector shipped for the built-in pair)")
    g.add_argument("--draft-mode", choices=("topk", "sample", "sample_without_replacement"), default=None,
                   help="how model drafters pick children (default: topk when greedy, "
                        "sample_without_replacement when sampling; chains always sample)")
    g.add_argument("--temperature", type=_temperature, default=0.0, metavar="T", help="0 = greedy (default)")
    g.add_argument("--top-p", type=_top_p, default=1.0, metavar="P")
    g.add_argument("--top-k", type=int, default=0, metavar="K")
    g.add_argument("--max-new-tokens", type=_positive_int, default=128, metavar="N")
    g.add_argument("--seed", type=int, default=None, metavar="S")
    g.add_argument("--chat", action="store_true", help="wrap the prompt in the tokenizer's chat template")
    g.add_argument("--compare", action="store_true",
                   help="also run the target alone (HF generate) and compare speed and output")
    g.set_defaults(func=cmd_generate)

    d = sub.add_parser("demo", help="the main job: the default pair on HumanEval, treespec vs the target alone",
                       description="Load the default model pair, size a tree for this machine, run a few "
                                   "HumanEval prompts with the target alone and with treespec, and report.")
    d.add_argument("--prompts", type=_positive_int, default=3, metavar="N", help="HumanEval prompts (default 3)")
    d.add_argument("--max-new-tokens", type=_positive_int, default=64, metavar="N")
    d.add_argument("--out", type=Path, default=Path("treespec-demo"), help="where the report and tree PNG go")
    add_model_options(d)
    d.set_defaults(func=cmd_demo)

    a = sub.add_parser("accept", help="measure a draft's positional acceptance vector",
                       description="Measure the positional acceptance vector (and per-depth matrix, beta) of "
                                   "a draft against the target on the target's own continuations of HumanEval "
                                   "calibration prompts; writes JSON usable by --acceptance.")
    add_model_options(a)
    a.add_argument("--calib", default="0:20", metavar="A:B", help="HumanEval prompts A..B-1 (default 0:20; keep "
                   "them disjoint from the prompts you evaluate on, e.g. 100-163)")
    a.add_argument("--width", type=_positive_int, default=8, help="proposals per position (vector length)")
    a.add_argument("--mode", choices=("topk", "sample", "sample_without_replacement"), default=None,
                   help="how the draft proposes (default: topk when greedy, else sample_without_replacement)")
    a.add_argument("--temperature", type=_temperature, default=0.0, metavar="T")
    a.add_argument("--top-p", type=_top_p, default=1.0, metavar="P")
    a.add_argument("--max-new-tokens", type=_positive_int, default=48, metavar="N")
    a.add_argument("--max-depth", type=_positive_int, default=8, metavar="D", help="rows of the per-depth matrix")
    a.add_argument("--out", type=Path, default=Path("acceptance.json"))
    a.set_defaults(func=cmd_accept)

    pr = sub.add_parser("profile", help="measure latencies and pick a tree for this machine",
                        description="Measure the target's tree-forward latency per tree size and the draft's cost "
                                    "per level, then pick the (budget, depth) maximising the predicted speedup "
                                    "G(n, d) / (t(n)/t(1) + d c) (Sequoia).")
    add_model_options(pr)
    pr.add_argument("--sizes", type=_positive_int, nargs="+", default=[1, 2, 4, 8, 16, 32], metavar="N")
    pr.add_argument("--acceptance", type=Path, default=None, metavar="JSON",
                    help="acceptance vector (default: the one shipped for the built-in pair)")
    pr.add_argument("--max-depth", type=_positive_int, default=8, metavar="D")
    pr.add_argument("--out", type=Path, default=Path("profile.json"))
    pr.set_defaults(func=cmd_profile)

    sub.add_parser("sweep", help="run a tree-budget sweep from a TOML config (see `treespec sweep --help`)",
                   add_help=False)
    return parser


def load_pair(args: argparse.Namespace, want_draft: bool = True):
    """Target, its tokenizer, and the draft models asked for (tokenizers checked against the target)."""
    from .models import DEFAULT_DRAFT, check_tokenizers, load

    dtype = dtype_for(args)
    target, tok = load(args.target, device=args.device, dtype=dtype)
    drafts = []
    names = args.draft if args.draft else ([DEFAULT_DRAFT] if want_draft else [])
    for name in names:
        model, draft_tok = load(name, device=args.device, dtype=dtype)
        check_tokenizers(tok, draft_tok)
        drafts.append(model)
    return target, tok, drafts


def default_acceptance(path: Path | None, temperature: float) -> list[float]:
    """The vector in ``path``, else the one shipped for the built-in pair (greedy or T=1)."""
    import json
    from importlib import resources

    if path is None:
        name = f"data/acceptance-qwen2.5-coder-t{0 if temperature == 0 else 1}.json"
        text = resources.files("treespec").joinpath(name).read_text()
    else:
        text = path.read_text()
    return json.loads(text)["vector"]


def make_drafters(drafts, *, tree: str, budget: int, depth: int | None, temperature: float,
                  mode: str | None, ngram: bool, acceptance) -> list:
    """Drafters for a CLI run: each draft model expands the chosen tree; the n-gram drafter last."""
    from tree_builders import for_budget

    from . import ModelDrafter, NGramDrafter

    drafters = []
    for model in drafts:
        if tree == "dynamic":
            drafters.append(ModelDrafter(model, mode="dynamic", depth=depth or 6, topk=8, nodes=budget - 1))
            continue
        shape = for_budget(tree, budget, acceptance if tree == "sequoia" else None, max_depth=depth)
        m = "sample" if tree == "chains" and temperature > 0 else mode
        m = m or ("topk" if temperature == 0 else "sample_without_replacement")
        drafters.append(ModelDrafter(model, shape, m))
    if ngram:
        drafters.append(NGramDrafter())
    return drafters


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


def eos_ids(model, tok) -> list[int]:
    eos = model.generation_config.eos_token_id
    eos = [eos] if isinstance(eos, int) else list(eos or [])
    return eos or ([tok.eos_token_id] if tok.eos_token_id is not None else [])


def cmd_generate(args: argparse.Namespace) -> int:
    import treespec

    text = args.prompt if args.prompt is not None else args.prompt_file.read_text()
    target, tok, drafts = load_pair(args, want_draft=not (args.ngram and not args.draft))
    acceptance = default_acceptance(args.acceptance, args.temperature) if args.tree == "sequoia" else None
    drafters = make_drafters(drafts, tree=args.tree, budget=args.budget, depth=args.depth,
                             temperature=args.temperature, mode=args.draft_mode, ngram=args.ngram,
                             acceptance=acceptance)
    ids = encode(tok, text, args.chat)
    eos = eos_ids(target, tok)
    stream = Streamer(tok)
    out = treespec.generate(target, ids, drafters=drafters, max_new_tokens=args.max_new_tokens,
                            temperature=args.temperature, top_k=args.top_k, top_p=args.top_p,
                            eos_token_id=eos, seed=args.seed, budget=args.budget, on_tokens=stream)
    s = out.stats
    print("\n" + "-" * 60)
    print(f"treespec: {s.new_tokens} tokens in {s.seconds:.2f} s = {s.tokens_per_second:.2f} tok/s, "
          f"{s.steps} steps, tau {s.tau:.2f}")
    print(f"time: prefill {s.prefill_seconds:.2f} s, drafting {s.drafting_seconds:.2f} s, "
          f"verifying {s.verifying_seconds:.2f} s, engine {s.overhead_seconds:.2f} s")
    for d in s.drafters:
        print(f"drafter {d.name}: {d.accepted} of {d.proposed} proposals committed")
    print("accepted drafted tokens per step:\n" + histogram(s.accepted_hist))
    if args.compare:
        from .baselines import hf_generate

        ref, secs = hf_generate(target, ids, args.max_new_tokens, temperature=args.temperature, top_p=args.top_p,
                                top_k=args.top_k, eos_token_id=eos, pad_token_id=(eos or [0])[0], seed=args.seed)
        print(f"target alone (HF generate): {len(ref)} tokens in {secs:.2f} s = {len(ref) / secs:.2f} tok/s")
        print(f"speedup: {s.tokens_per_second / (len(ref) / secs):.2f}x")
        if args.temperature == 0:
            same = ref == out.new_tokens
            print(f"greedy outputs identical: {'yes' if same else 'NO'}")
            return 0 if same else 1
    return 0


def cmd_demo(args: argparse.Namespace) -> int:
    from .demo import run_demo

    return run_demo(args)


def cmd_accept(args: argparse.Namespace) -> int:
    from .acceptance import encode_prompts, measure
    from .models import humaneval_prompts

    start, stop = (int(x) for x in args.calib.split(":"))
    target, tok, drafts = load_pair(args)
    mode = args.mode or ("topk" if args.temperature == 0 else "sample_without_replacement")
    acc = measure(target, drafts[0], encode_prompts(tok, humaneval_prompts(start, stop)), width=args.width,
                  mode=mode, temperature=args.temperature, top_p=args.top_p, max_new_tokens=args.max_new_tokens,
                  max_depth=args.max_depth, prompts_label=f"humaneval[{start}:{stop}]")
    acc.save(args.out)
    print(acc)
    print(f"written to {args.out}")
    return 0


def cmd_profile(args: argparse.Namespace) -> int:
    from .profile import profile

    target, _, drafts = load_pair(args)
    prof = profile(target, drafts[0], sizes=args.sizes)
    choice = prof.choose(default_acceptance(args.acceptance, 0.0), budgets=list(range(2, max(args.sizes) + 1)),
                         max_depth=args.max_depth)
    t1 = prof.target_latency[1]
    print("tree size | target forward s | relative to 1 token")
    for n, t in sorted(prof.target_latency.items()):
        print(f"{n:>9} | {t:>16.3f} | {t / t1:.2f}")
    print(f"draft forward per level: {prof.draft_level_seconds:.3f} s (c = {choice.c:.2f})")
    print(f"best: {choice}\n{choice.shape}")
    prof.save(args.out)
    print(f"written to {args.out}")
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv and argv[0] == "sweep":
        from .experiments import main as sweep_main

        return sweep_main(argv[1:]) or 0
    args = build_parser().parse_args(argv)
    return args.func(args)


if __name__ == "__main__":
    sys.exit(main())
