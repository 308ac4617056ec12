"""What each ``treespec`` command runs (generate, demo, accept, profile; ``treespec.bench.sweep`` runs sweep):
``treespec.cli`` imports this module once the options are parsed.

Options (parsed by ``treespec.cli_parser``) become a :class:`~treespec.recipes.Recipe` right after parsing
(so a bad setting fails before any model loads), and every command runs it through ``treespec.recipes``
like any API user.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any, Callable, Iterable, Sequence, TypeVar

from . import cli_output
from .calibrate import target_precision
from .calibrate.choices import Resolved, resolve_run
from .calibrate.vectors import acceptance_for_draft, default_acceptance
from .cli_input import check_context, encode_all, read_paths, read_prompt_lines, read_prompts
from .cli_output import Streamer, print_stats
from .common.files import check_writable
from .common.options import DEFAULT_DRAFT, TUNED_TREES
from .core.linear_layout import layout_of
from .models.pair import CrossDraft, draft_model, eos_ids, load_pair
from .recipes import NGramSettings, Recipe, draft_mode, plan, run, verified_tokens

T = TypeVar("T")


def load_models(args: argparse.Namespace, want_draft: bool = True, tuned_target: bool = False,
                tree_size: int | None = None, recipe: Recipe | None = None):
    """Target, its tokenizer and the draft models the options ask for (default draft unless none is wanted).
    ``tuned_target`` (the commands that run the pair: generate, demo): a GGUF target in ``auto`` precision on a CPU
    with one draft model or none runs in bfloat16 or on its file's own 4-bit blocks
    (``treespec.calibrate.target_precision``): with a tuned tree (one draft, no ``--budget``, a Sequoia, chain
    or k-ary tree, no n-gram drafter) the one whose tuned tree is predicted fastest here; with a set ``tree_size``
    (the recipe's ``--budget``, 1 for plain decoding, its ``--paths`` tree's size; the n-gram drafter alone: its
    largest tree under that budget) the one that forwards that many tokens faster; with a ``recipe`` whose tree a
    pilot sizes (no ``--budget``, not the tuner's) the one whose pilot choice is predicted faster. Elsewhere
    ``auto`` keeps the floating precision one forward measures fastest."""
    names = args.draft if args.draft else ([DEFAULT_DRAFT] if want_draft else [])
    draft_dtype, compile = getattr(args, "draft_dtype", None), getattr(args, "compile", None) or False
    if tuned_target and target_precision.applies(args.target, names, args.device, args.dtype):
        if tuned_tree(args) and names:
            return target_precision.load_pair_tuned(args.target, names[0], draft_dtype=draft_dtype, compile=compile,
                                                    temperature=getattr(args, "temperature", 0.0),
                                                    chat=getattr(args, "chat", False), tree=recipe)
        if tree_size is not None:
            return target_precision.load_pair_sized(args.target, names[0] if names else None, tree_size=tree_size,
                                                    draft_dtype=draft_dtype, compile=compile)
        if recipe is not None:
            return target_precision.load_pair_piloted(args.target, names[0] if names else None, recipe,
                                                      draft_dtype=draft_dtype, compile=compile)
    return load_pair(args.target, names, device=args.device, target_dtype=args.dtype, draft_dtype=draft_dtype,
                     compile=compile)


def same_tokenizer(drafts: Sequence[Any], command: str) -> Any:
    """The one draft of ``command`` (demo, accept, profile), refused where it has another tokenizer than the target's:
    those commands time and measure a model drafting the target's own tokens."""
    if isinstance(drafts[0], CrossDraft):
        raise ValueError(f"`treespec {command}` measures a draft model of the target's tokenizer, and this draft has "
                         "another (its text re-tokenised: `treespec generate` runs such a pair); give a draft of the "
                         "target's family")
    return drafts[0]


def recipe_from_args(args: argparse.Namespace, with_model: bool = True) -> Recipe:
    """The recipe ``treespec generate`` runs for its options (``--budget`` absent: None, resolved later). A Sequoia
    tree carries the acceptance it is built from; a chain or k-ary tree without a budget the acceptance it is
    sized from (``options.TUNED_TREES``; with the n-gram drafter a pilot sizes it)."""
    with_acceptance = with_model and (args.tree == "sequoia" or tuned_tree(args))
    unread = [o for o, given in (("--acceptance", getattr(args, "acceptance", None) is not None),
                                 ("--positional-acceptance", getattr(args, "positional_acceptance", False))) if given]
    if unread and not with_acceptance:
        raise ValueError(f"{unread[0]} sizes a Sequoia tree, or a chain or kary tree the tuner sizes (no --budget, "
                         f"no --ngram, a draft model); this --tree {args.tree!r} run does not read it: drop it"
                         + (", or drop --budget" if args.budget is not None and args.tree in ("chain", "kary") else ""))
    return Recipe(tree=args.tree, budget=args.budget, depth=args.depth, temperature=args.temperature,
                  paths=read_paths(getattr(args, "paths", None), args.tree), **builder_options(args),
                  top_k=args.top_k, top_p=args.top_p, draft_mode=args.draft_mode,
                  ngram=NGramSettings() if args.ngram else None,
                  acceptance=default_acceptance(args.acceptance, args.temperature, chat=args.chat,
                                                per_depth=not args.positional_acceptance) if with_acceptance else None,
                  target_dtype=args.dtype, draft_dtype=args.draft_dtype, verifier=args.verifier,
                  compile=args.compile or False)  # None (decided after resolving, resolve_compile): eager until then


def tuned_tree(args: argparse.Namespace) -> bool:
    """Whether the options leave the tree to the tuner (``options.TUNED_TREES``, no ``--budget``, no ``--ngram``;
    with one draft model of the target's tokenizer, ``choices.tunable``); the demo's options: its Sequoia tree."""
    return (getattr(args, "budget", None) is None and getattr(args, "tree", "sequoia") in TUNED_TREES
            and not getattr(args, "ngram", False))


def builder_options(args: argparse.Namespace) -> dict[str, int]:
    """``--kary-width`` and ``--chains`` as recipe fields, each refused with a tree it does not shape."""
    options = {}
    for option, field, tree in (("--kary-width", "kary_width", "kary"), ("--chains", "chains", "chains")):
        value = getattr(args, field, None)
        if value is None:
            continue
        if args.tree != tree:
            raise ValueError(f"{option} is an option of --tree {tree}; the {args.tree!r} tree does not read it: "
                             f"drop it, or give --tree {tree}")
        options[field] = value
    return options


def _warm_up(args: argparse.Namespace, recipe: Recipe, target, drafts: Sequence[Any], prompts: list[list[int]],
             eos: list[int]) -> None:
    """``--compare``'s warm-up, untimed and the same for both methods, as the benchmarks give every method: the
    longest prompt once through treespec (its whole run: a compiled step compiles its graphs for this tree, depth
    cap and cache size here, not inside the first timed prompt) and through HF ``generate``."""
    from .bench.baselines import hf_generate

    longest = max(prompts, key=len)
    t0 = time.perf_counter()
    run(recipe, target, drafts, longest, max_new_tokens=args.max_new_tokens, seed=args.seed, eos_token_id=eos)
    t1 = time.perf_counter()
    hf_generate(target, longest, args.max_new_tokens, temperature=recipe.temperature, top_p=recipe.top_p,
                top_k=recipe.top_k, eos_token_id=eos, pad_token_id=(eos or [0])[0], seed=args.seed)
    print(f"warm-up (untimed, the longest prompt through each method): treespec {t1 - t0:.1f} s"
          f"{' (compiling its graphs)' if recipe.compile else ''}, HF generate {time.perf_counter() - t1:.1f} s",
          file=sys.stderr if args.json else sys.stdout, flush=True)


def _compare(args: argparse.Namespace, recipe: Recipe, target, ids: list[int], eos: list[int], out,
             record: dict[str, Any], index: int) -> bool:
    """``--compare``: the target alone (HF generate) on the same prompt; False if greedy outputs differ anywhere
    but at a tie of the target's top two logits (``record["divergence"]``: where, and the gap there)."""
    from .bench.baselines import hf_generate
    from .bench.compare import first_divergence

    ref, secs = hf_generate(target, ids, args.max_new_tokens, temperature=recipe.temperature, top_p=recipe.top_p,
                            top_k=recipe.top_k, eos_token_id=eos, pad_token_id=(eos or [0])[0],
                            seed=cli_output.prompt_seed(args.seed, index))
    record.update(hf_tokens_per_second=len(ref) / secs, speedup=out.stats.tokens_per_second / (len(ref) / secs))
    if recipe.temperature == 0:
        record["identical"] = ref == out.new_tokens
        if not record["identical"]:
            record["divergence"] = first_divergence(target, ids, ref, out.new_tokens)
    if not args.json:
        print(f"target alone (HF generate): {len(ref)} tokens in {secs:.2f} s = {len(ref) / secs:.2f} tok/s")
        predicted = record.get("predicted", {}).get("speedup_prefill_charged")
        print(f"speedup: {record['speedup']:.2f}x" + ("" if predicted is None else
                                                     f" (predicted {predicted:.2f}x with this run's prefill charged)"))
        if "identical" in record:
            said = "yes" if record["identical"] else cli_output.divergence(record["divergence"])
            print(f"greedy outputs identical: {said}")
    return record.get("identical", True) or bool((record.get("divergence") or {}).get("near_tie"))


def cmd_generate(args: argparse.Namespace) -> int:
    lines = read_prompt_lines(args)
    prompts, inputs = [text for text, _ in lines], [fields for _, fields in lines]
    if args.batch_size > 1 and args.compare:
        raise ValueError(f"--compare runs HF generate on one prompt at a time, beside a run of one prompt: drop "
                         f"it with --batch-size {args.batch_size} (or use --batch-size 1)")
    want_draft = not (args.ngram and not args.draft)
    recipe = recipe_from_args(args, with_model=want_draft)  # validates before the models load
    done = _done(args, prompts, inputs)
    todo = [i for i in range(len(prompts)) if i not in done]
    if not todo:
        print(f"all {len(prompts)} prompts are in {args.out} already", file=sys.stderr)
        return 0
    # the tokens a set tree verifies (--budget, --paths; the n-gram drafter alone: its largest tree under it), for the
    # target's rendering; None: the tuner or a pilot sizes the tree
    set_size = verified_tokens(recipe, want_draft) if recipe.budget is not None or recipe.paths is not None else None
    target, tok, drafts = load_models(args, want_draft, tuned_target=True, tree_size=set_size, recipe=recipe)
    # an empty prompt is refused before anything is measured
    encoded = encode_all(tok, [prompts[i] for i in todo], args.chat, todo, len(prompts))
    check_context(encoded, args.max_new_tokens, target, todo, len(prompts), drafts)
    recipe = cli_output.resumed_tree(args.out, done, recipe)  # after loading: the target's rendering is decided apart
    # the tree (from the acceptance of the draft's precision, chat's with --chat), then whether the steps compile
    resolved = resolve_run(recipe, target, drafts, tok, prompts=encoded, max_new_tokens=args.max_new_tokens,
                           acceptance_file=args.acceptance, chat=args.chat,
                           per_depth=not args.positional_acceptance, batch_size=args.batch_size, compile=args.compile)
    recipe = resolved.recipe
    cli_output.check_resume(args.out, done, resolved)
    print(f"configuration: {resolved.why}", file=sys.stderr if args.json else sys.stdout, flush=True)
    eos = eos_ids(target, tok)
    if args.batch_size > 1:
        return _generate_batches(args, prompts, inputs, todo, encoded, resolved, target, tok, drafts, eos)
    status = 0
    layouts, tree = _layouts(target, drafts), _tree(recipe, drafts, args.max_new_tokens)  # the same for every prompt
    if args.compare:
        _warm_up(args, recipe, target, drafts, encoded, eos)
    for i, ids in _progress(args, zip(todo, encoded), len(todo)):
        streamer = None if args.json else Streamer(tok)
        out = run(recipe, target, drafts, ids, max_new_tokens=args.max_new_tokens,
                  seed=cli_output.prompt_seed(args.seed, i), eos_token_id=eos, on_tokens=streamer)
        if streamer is not None:
            streamer.end()
        record = cli_output.record(prompts[i], out, resolved, tok, layouts, tree)
        if not args.json:
            print_stats(out.stats)
        if args.compare and not _compare(args, recipe, target, ids, eos, out, record, i):
            status = 1
        _emit(args, i, record, inputs[i])
    return status


def _done(args: argparse.Namespace, prompts: list[str], inputs: list[dict[str, Any]]) -> dict[int, dict[str, Any]]:
    """The records of the prompts done already, by index: with ``--out``, those it holds (``cli_output``); else
    none."""
    if args.out is None:
        return {}
    check_writable(args.out)  # fail now, not after minutes of work
    done = cli_output.finished(args.out, args, prompts, inputs)
    if 0 < len(done) < len(prompts):
        print(f"{args.out} holds {len(done)} of the {len(prompts)} prompts already; generating the other "
              f"{len(prompts) - len(done)}", file=sys.stderr)
    return done


def _progress(args: argparse.Namespace, items: Iterable[T], total: int, unit: str = "prompts") -> Iterable[T]:
    """``items`` behind a progress bar on a terminal's stderr when ``--json`` leaves no text to watch (the streamed
    text is the progress otherwise)."""
    from tqdm.auto import tqdm

    return tqdm(items, total=total, desc=unit, unit="", disable=None if args.json and total > 1 else True,
                file=sys.stderr, leave=False)


def _emit(args: argparse.Namespace, index: int, record: dict[str, Any], fields: dict[str, Any]) -> None:
    """Prompt ``index``'s record (with ``fields``, the other fields of its JSONL line, under ``"input"``): printed
    with ``--json``, appended to ``--out`` (durably) as soon as it is done."""
    if fields:
        record = {**record, "input": fields}
    if args.json:
        print(json.dumps(record), flush=True)
    if args.out is not None:
        cli_output.write(args.out, index, record, args)


def _layouts(target: Any, drafts: Sequence[Any]) -> dict[str, Any]:
    """The ``nn.Linear`` layout each model's forwards run in (``treespec.core.linear_layout``), for the records."""
    return {"target": layout_of(target),
            "drafts": [layout_of(draft_model(d)) for d in drafts]}


def _tree(recipe: Recipe, drafts: Sequence[Any], max_new_tokens: int) -> list[list[int]] | None:
    """The static tree the model drafter drafts (its child-rank paths, BFS order), None without one (a dynamic tree,
    the n-gram drafter alone, plain decoding, a draft of another tokenizer, which proposes re-tokenised chains)."""
    if any(isinstance(d, CrossDraft) for d in drafts):
        return None
    shape = plan(recipe, with_model=bool(drafts), max_new_tokens=max_new_tokens).shape
    return None if shape is None else [list(p) for p in shape.paths]


def _generate_batches(args: argparse.Namespace, prompts: list[str], inputs: list[dict[str, Any]], todo: list[int],
                      encoded: list[list[int]], resolved: Resolved, target: Any, tok: Any, drafts: Sequence[Any],
                      eos: list[int]) -> int:
    """``--batch-size B``: the prompts in batches of B, each decoded at once (``treespec.core.batch``); each row's
    text (or JSON record, with its row, batch size and the batch's tokens/s) once its batch is done."""
    layouts, tree = _layouts(target, drafts), _tree(resolved.recipe, drafts, args.max_new_tokens)
    for start in _progress(args, range(0, len(todo), args.batch_size), -(-len(todo) // args.batch_size), "batches"):
        indices = todo[start : start + args.batch_size]
        seeds = None if args.seed is None else [cli_output.prompt_seed(args.seed, i) for i in indices]
        out = run(resolved.recipe, target, drafts, encoded[start : start + args.batch_size],
                  max_new_tokens=args.max_new_tokens, seed=seeds, eos_token_id=eos)
        for r, (i, row) in enumerate(zip(indices, out.rows)):
            _emit(args, i, {**cli_output.record(prompts[i], row, resolved, tok, layouts, tree), "row": r,
                            "batch_size": len(indices), "row_seconds": out.row_seconds[r],
                            "batch": {"forwards": out.forwards, **out.stats.record()}}, inputs[i])
            if not args.json:
                print(f"--- prompt {i} (batch of {len(indices)}) ---\n"
                      f"{tok.decode(row.new_tokens, skip_special_tokens=True)}")
        if not args.json:
            print_stats(out.stats)
    return 0


def cmd_demo(args: argparse.Namespace) -> int:
    from .bench.demo import run_demo

    check_writable(args.out, directory=True)  # fail now, not after minutes of loading and profiling
    print("loading the target and the draft (the first run builds the model cache: a few minutes) ...", flush=True)
    target, tok, drafts = load_models(args, tuned_target=True)
    return run_demo(args, target, tok, same_tokenizer(drafts, "demo"))


def cmd_accept(args: argparse.Namespace) -> int:
    from .bench.datasets import dataset_prompts, prompt_range
    from .calibrate.acceptance import MeasuredAcceptance, measure_each

    if args.prompt_file is not None or args.prompts_jsonl is not None:
        if args.dataset is not None:
            raise ValueError("--dataset picks the built-in prompts --calib ranges over: drop it with --prompt-file or "
                             "--prompts-jsonl (your own prompts)")
        texts = read_prompts(args)
        label = f"{(args.prompt_file or args.prompts_jsonl).name} ({len(texts)} prompts)"
    else:
        dataset = args.dataset or "humaneval"
        every = dataset_prompts(dataset)
        start, stop = prompt_range(args.calib, len(every), "--calib")
        texts, label = list(every[start:stop]), f"{dataset}[{start}:{stop}]"
    label += " in the chat template" if args.chat else ""
    check_writable(args.out)  # fail now, not after minutes of measuring
    # each prompt's part is kept as it is measured: a stopped run, run again, measures only the others
    parts_file = Path(f"{args.out}.parts.jsonl")
    saved = {i: rec["part"] and MeasuredAcceptance.from_dict(rec["part"])
             for i, rec in cli_output.finished(parts_file, args, texts).items()}
    if saved:
        print(f"{parts_file} holds {len(saved)} of the {len(texts)} prompts' measurements; measuring the others",
              file=sys.stderr)

    def keep(j: int, part: MeasuredAcceptance | None) -> None:
        saved[j] = part
        cli_output.write(parts_file, j, {"prompt": texts[j], "part": part and part.to_dict()}, args)

    if len(saved) < len(texts):
        target, tok, drafts = load_models(args)
        encoded = encode_all(tok, texts, args.chat)
        check_context(encoded, args.max_new_tokens, target, drafts=drafts)
        # each continuation ends at the target's end of sequence, where `treespec generate` stops (the text after
        # it is no run's)
        measure_each(target, same_tokenizer(drafts, "accept"), encoded, width=args.width,
                     mode=draft_mode("sequoia", args.temperature, args.mode), temperature=args.temperature,
                     top_k=args.top_k, top_p=args.top_p, max_new_tokens=args.max_new_tokens, max_depth=args.max_depth,
                     prompts_label=label, context=args.context, batch_size=args.batch_size, done=saved, on_prompt=keep,
                     eos_token_id=eos_ids(target, tok) or None)
    parts = [saved[j] for j in sorted(saved) if saved[j] is not None]
    if not parts:
        raise ValueError("no continuation tokens were generated: give at least one prompt (and max_new_tokens >= 1)")
    acc = MeasuredAcceptance.merge(parts)
    acc.meta["prompts"] = len(texts)
    acc.save(args.out)
    parts_file.unlink(missing_ok=True)  # the measurement is whole: its parts are in args.out
    print(acc)
    print(f"written to {args.out}")
    return 0


def cmd_profile(args: argparse.Namespace) -> int:
    from .calibrate.choices import builder_of
    from .calibrate.costs import profile
    from .calibrate.step_cost import Builder

    default_acceptance(args.acceptance, 0.0, per_depth=not args.positional_acceptance)  # a bad file refused first
    builder = builder_of(Recipe(tree=args.tree, **builder_options(args)))
    if 1 not in args.sizes or max(args.sizes) < 2:
        raise ValueError(f"--sizes {' '.join(map(str, args.sizes))}: give 1 (plain decoding's forward, what a speedup "
                         "is over) and at least one larger tree size, e.g. --sizes 1 2 4 8")
    check_writable(args.out)  # fail now, not after minutes of profiling
    target, _, drafts = load_models(args)
    draft = same_tokenizer(drafts, "profile")
    # the rows of the draft's own precision where none are given (as generate and the demo size trees; the int8
    # draft's were read whatever the draft)
    acceptance, _ = acceptance_for_draft(args.acceptance, 0.0, draft, per_depth=not args.positional_acceptance)
    prof = profile(target, draft, sizes=args.sizes)
    builders = list(dict.fromkeys([None, Builder("chain"), Builder("kary", 2), Builder("kary", 3), builder]))
    # budget 1 is plain decoding, priced at one token's forward (from 2, the plain cell was priced at two tokens')
    choices = {b: prof.choose(acceptance, budgets=list(range(1, max(args.sizes) + 1)), max_depth=args.max_depth,
                              builder=b) for b in builders}
    choice = choices[builder]
    t1 = prof.target_latency[1]
    print("tree size | target forward s | relative to 1 token")
    for n, t in sorted(prof.target_latency.items()):
        print(f"{n:>9} | {t:>16.3f} | {t / t1:.2f}")
    widths = ", ".join(f"{w} tokens {s:.3f} s" for w, s in sorted((prof.draft_level_latency or {}).items()))
    print(f"draft forward per level: {widths} (c = {choice.c:.2f})")
    if prof.plain_decode_seconds:
        print(f"the target's own decoding (HF generate): {prof.plain_decode_seconds:.3f} s per token, what the "
              "speedup is relative to")
    said = ("plain decoding: no tree of this builder is predicted to pay here" if choice.depth == 0 else
            f"{choice.shape.size} tokens (budget), depth {choice.shape.depth}, nodes per level "
            f"{list(choice.shape.widths)}: tau {choice.tau:.2f}, {choice.step_seconds:.3f} s per step, "
            f"{choice.speedup:.2f}x predicted\n{choice.shape}")
    print(f"best{' Sequoia tree' if builder is None else ' ' + builder.describe()}: {said}")
    print("each builder at its own best size under these costs (predicted):\n"
          "builder | budget | depth | nodes per level | tau | s per step | tokens/s | speedup")
    for other, best in choices.items():
        print(f"{'Sequoia' if other is None else other.describe()} | {best.shape.size} | {best.shape.depth} | "
              f"{list(best.shape.widths)} | {best.tau:.2f} | {best.step_seconds:.3f} | {best.tokens_per_second:.2f} | "
              f"{best.speedup:.2f}x")
    prof.save(args.out)
    print(f"written to {args.out}")
    return 0


#: what each command runs (``treespec sweep`` has its own parser: ``treespec.bench.sweep.cli``)
COMMANDS: dict[str, Callable[[argparse.Namespace], int]] = {"generate": cmd_generate, "demo": cmd_demo,
                                                            "accept": cmd_accept, "profile": cmd_profile}
