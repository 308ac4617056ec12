"""What the commands print and write: ``treespec generate``'s text as it is committed (:class:`Streamer`), its
figures (:func:`print_stats`) and each prompt's JSON record (:func:`record`), and the files a stopped run resumes
from.

``generate --out F``: each prompt's JSON record (what ``--json`` prints) appended to ``F`` as soon as the prompt is
done, durably (``common.jsonl``), so a long run over a prompt file loses nothing when it stops; run again with the
same prompts and settings, it generates only the prompts ``F`` does not hold yet. ``accept --out A`` keeps each
prompt's measurement in ``A.parts.jsonl`` the same way until ``A`` is written.

A record carries the prompt's ``index`` in the prompt list and the :func:`settings` it was made under; a file made
under other settings (another model, precision, tree, sampling, a sampled run's seed, ...) is refused rather than
mixed with this run's outputs. The batch size changes no output (each prompt's seed is its own: :func:`prompt_seed`)
and is not a setting; nor is compiling, which changes no greedy output, but a sampled run's eager and compiled steps
draw their random numbers differently, so a sampled file made under the other step is refused too, as is a file
made with the models in other precisions (``--dtype auto`` decided again: :func:`check_resume`). A sampled run whose
tree the tuner sizes resumes with the tree its records were made with (:func:`resumed_tree`: a tuned tree follows
the batch and the machine's timings, and another tree draws other samples)."""

from __future__ import annotations

import argparse
import sys
from dataclasses import replace
from pathlib import Path
from typing import Any

from .calibrate.choices import Resolved
from .common.jsonl import append_record, read_records, repair_tail
from .core.batch import row_seed
from .core.stats import GenerateOutput, Stats
from .recipes import Recipe


class Streamer:
    """Prints the decoded text as tokens are committed. A character whose bytes span several tokens (an emoji, a
    rare CJK character under byte-level BPE) decodes as U+FFFD until its last byte comes, so a trailing U+FFFD is
    held back until then (or until :meth:`end`, where an invalid sequence prints as it decodes)."""

    def __init__(self, tok, out=None) -> None:
        # sys.stdout as it is now (None), not as it was when this module was imported
        self.tok, self.out, self.ids, self.printed = tok, sys.stdout if out is None else out, [], 0

    def __call__(self, tokens: list[int]) -> None:
        self.ids += tokens
        self._write(self.tok.decode(self.ids, skip_special_tokens=True).rstrip("\ufffd"))

    def end(self) -> None:
        """Print what was held back: the generation is over."""
        self._write(self.tok.decode(self.ids, skip_special_tokens=True))

    def _write(self, text: str) -> None:
        self.out.write(text[self.printed :])
        self.out.flush()
        self.printed = max(self.printed, len(text))


def histogram(hist: list[int], width: int = 40) -> str:
    """``hist`` as rows of ``#`` bars, one per count."""
    top = max(hist) if hist else 1
    return "\n".join(f"  {k:>3} | {'#' * max(1, round(width * n / top)) if n else '':<{width}} {n}"
                     for k, n in enumerate(hist))


def print_stats(s: Stats) -> None:
    """The run's figures, drafters and accepted-length histogram, after its text."""
    print("\n" + "-" * 60)
    print(f"treespec: {s.new_tokens} tokens in {s.seconds:.2f} s = {s.tokens_per_second:.2f} tok/s, "
          f"{s.steps} steps, tau {s.tau:.2f}" + ("" if s.step == "eager" else f"; step: {s.step}"))
    print(f"time: prefill {s.prefill_seconds:.2f} s, drafting {s.drafting_seconds:.2f} s, "
          f"verifying {s.verifying_seconds:.2f} s, engine {s.overhead_seconds:.2f} s")
    for d in s.drafters:
        print(f"drafter {d.name}: {d.accepted} of {d.proposed} proposals committed")
    print("accepted drafted tokens per step:\n" + histogram(s.accepted_hist))


def record(text: str, out: GenerateOutput, resolved: Resolved, tok: Any, layouts: dict[str, Any],
           tree: list[list[int]] | None) -> dict[str, Any]:
    """The JSON record of one prompt's output: its figures, text, configuration (``tree``: the static tree
    drafted), and the prediction beside them."""
    recipe = resolved.recipe
    rec = {"prompt": text, **out.stats.record(), "new_tokens": out.new_tokens,
           "text": tok.decode(out.new_tokens, skip_special_tokens=True), "configuration": resolved.why,
           "recipe": {"tree": recipe.tree, "budget": recipe.budget, "depth": recipe.depth,
                      "max_width": recipe.max_width, "verifier": recipe.verifier, "compile": recipe.compile,
                      "target_dtype": recipe.target_dtype, "draft_dtype": recipe.draft_dtype, "paths": tree,
                      "min_confidence": recipe.min_confidence},
           "linear_layout": layouts}
    if resolved.tuned is not None:  # the prediction beside the measurement, for anyone to check
        s = out.stats
        p = resolved.tuned.prediction
        # beside ``speedup`` (tok/s with --compare, the prefill in it): the prediction with this run's prefill charged,
        # the draft's part of it (predicted for this prompt's length) to treespec's side alone
        prompt_tokens = out.sequences.shape[1] - len(out.new_tokens)
        draft = resolved.tuned.draft_prefill_of(prompt_tokens) if recipe.budget > 1 else 0.0
        rec["predicted"] = {**p.as_dict(), "draft_prefill_seconds": draft,
                            "speedup_prefill_charged": p.run_speedup(s.new_tokens, s.prefill_seconds, draft)}
        rec["measured"] = {"tau": s.tau, "step_seconds": (s.drafting_seconds + s.verifying_seconds
                                                          + s.overhead_seconds) / max(s.steps, 1)}
    return rec


#: the arguments that decide a command's outputs (what ``--out`` resumes): a record made under others is not this
#: run's. The batch size changes no output of a given tree (a batch's rows up to a batched forward's rounding; a
#: sampled run resumes with its records' tuned tree: :func:`resumed_tree`); the seed none when
#: greedy (:func:`settings` drops it there); compiling none when greedy (:func:`check_resume` for sampled runs).
SETTINGS = {
    "generate": ("target", "draft", "device", "dtype", "draft_dtype", "ngram", "tree", "kary_width", "chains",
                 "paths", "budget", "depth", "acceptance", "positional_acceptance", "draft_mode", "temperature",
                 "top_p", "top_k", "max_new_tokens", "seed", "chat", "verifier"),
    "accept": ("target", "draft", "device", "dtype", "draft_dtype", "calib", "prompt_file", "prompts_jsonl", "width",
               "mode", "temperature", "top_p", "top_k", "max_new_tokens", "max_depth", "context", "chat"),
}
#: the options that decide no output: where it goes and how it is shown, the batch size; the prompts' sources
#: (each record's prompt is compared itself: :func:`finished`); compiling (:func:`check_resume`)
NOT_SETTINGS = {"generate": ("batch_size", "compare", "compile", "json", "out", "prompt", "prompt_file",
                             "prompts_jsonl"),
                "accept": ("batch_size", "dataset", "out")}

#: what a corrupt line of ``--out`` suggests besides fixing or deleting it
HINT = "give another --out"


def settings(args: argparse.Namespace) -> dict[str, Any]:
    """The run's :data:`SETTINGS` (of ``args.command``), as JSON values (paths as strings); ``generate``'s seed only
    when it samples (a greedy run's output does not depend on it)."""
    keys = [k for k in SETTINGS[args.command]
            if not (k == "seed" and args.command == "generate" and getattr(args, "temperature", 0) == 0)]
    return {k: str(v) if isinstance(v, Path) else v for k in keys for v in [getattr(args, k, None)]}


def prompt_seed(seed: int | None, index: int) -> int | None:
    """The seed prompt ``index`` of a prompt list runs with: ``--seed`` itself for prompt 0, a hash of both for the
    others (``core.batch.row_seed``), so a prompt's sampled output is its own whatever the batch size, its batch
    mates or a resumed run's start, and two prompts do not share their random numbers. None (no ``--seed``): a
    random seed per prompt."""
    return None if seed is None else row_seed(seed, index)


#: what a record's ``recipe`` holds of the tree a run drafted, besides its builder (a setting): the tuner's choices
TREE_CHOICES = ("budget", "depth", "max_width", "min_confidence")


def made_with(done: dict[int, dict[str, Any]], fields: tuple[str, ...]) -> dict[str, Any] | None:
    """The values of ``fields`` of the recipe every record of ``done`` was made with, where they all agree (None: no
    records, or records that differ)."""
    made = {tuple((rec.get("recipe") or {}).get(k) for k in fields) for rec in done.values()}
    return dict(zip(fields, made.pop())) if len(made) == 1 else None


def resumed_tree(path: Path, done: dict[int, dict[str, Any]], recipe: Recipe) -> Recipe:
    """``recipe`` with the tree ``path``'s records (``done``) were made with, where this is a sampled run that leaves
    the tree to the tuner and they were tuned: the tuner sizes a tree for a run's batch, its prompts' length and this
    machine's timings, so the prompts left could get another tree, and another tree draws other samples for one seed
    (each exact). A greedy run's tokens are the target's own under any tree: sized afresh."""
    if recipe.temperature == 0 or recipe.budget is not None or not done:
        return recipe
    tree = made_with(done, TREE_CHOICES)
    if tree is None or tree["budget"] is None:
        return recipe
    print(f"[treespec] resuming {path} with the tree its sampled outputs were made with (budget {tree['budget']}, "
          f"depth {tree['depth']}), not sized again", file=sys.stderr)
    return replace(recipe, **tree)


def check_resume(path: Path, done: dict[int, dict[str, Any]], resolved: Resolved) -> None:
    """Refuse to add this run's outputs to ``path``'s (``done``, :func:`finished`) where they were made with other
    models: another precision of the target or the draft (``--dtype auto`` decided otherwise: a decision made again),
    which are other models' outputs; or, for a sampled run, with the other step, eager or compiled: the two draw
    their random numbers differently (each exact), so one seed gives other samples. Greedy runs are alike under
    both."""
    recipe = resolved.recipe
    precisions = made_with(done, ("target_dtype", "draft_dtype"))
    mine = {"target_dtype": recipe.target_dtype, "draft_dtype": recipe.draft_dtype}
    known = precisions is None or precisions["target_dtype"] is not None  # (records made before they named them)
    if done and known and precisions != mine:
        theirs = precisions or {"target_dtype": "several", "draft_dtype": "several"}
        fix = f"pass --dtype {theirs['target_dtype']}" + (f" --draft-dtype {theirs['draft_dtype']}"
                                                          if theirs["draft_dtype"] else "")
        raise ValueError(f"{path} holds outputs made with the target in {theirs['target_dtype']} and the draft in "
                         f"{theirs['draft_dtype']}, and this run's are {recipe.target_dtype} and {recipe.draft_dtype}"
                         f" (other models' outputs): {fix + ' to resume it as it was made, or ' if precisions else ''}"
                         "give another --out")
    if recipe.temperature == 0:
        return
    mine = bool(resolved.recipe.compile)
    theirs = {bool((rec.get("recipe") or {}).get("compile")) for rec in done.values()}
    if theirs and theirs != {mine}:
        step = "compiled" if mine else "eager"
        raise ValueError(f"{path} holds sampled outputs made with {'eager' if mine else 'compiled'} steps, and this "
                         f"run's steps are {step} (their random numbers differ for one seed): pass "
                         f"{'--no-compile' if mine else '--compile'} to resume it as it was made, or give another "
                         "--out")


def finished(path: Path, args: argparse.Namespace, prompts: list[str],
             inputs: list[dict[str, Any]] | None = None) -> dict[int, dict[str, Any]]:
    """The records ``path`` holds under this run's settings, by the index of their prompt in ``prompts`` (a torn last
    line, from a stop while writing, is cut). A record of other settings, of another prompt at its index, or whose
    prompt's other fields (``inputs``: what a record keeps under ``"input"``) changed, is refused."""
    repair_tail(path)
    mine, done = settings(args), {}
    for n, rec in enumerate(read_records(path, hint=HINT), start=1):
        theirs = rec.get("settings") or {}
        changed = [k for k in mine if theirs.get(k) != mine[k]]
        if changed:
            k = changed[0]
            raise ValueError(f"{path} holds outputs made with other settings ({k}: {theirs.get(k)!r} -> {mine[k]!r}"
                             f"{f', and {len(changed) - 1} more' if len(changed) > 1 else ''}): give another --out, "
                             f"or move {path} aside to start over")
        i = rec.get("index")
        if not (isinstance(i, int) and 0 <= i < len(prompts) and rec.get("prompt") == prompts[i]):
            raise ValueError(f"{path}, record {n}: its prompt (index {i!r}) is not prompt {i!r} of these prompts: "
                             "give another --out for another prompt file")
        if inputs is not None and (rec.get("input") or {}) != (inputs[i] or {}):
            raise ValueError(f"{path}, record {n}: prompt {i}'s other fields changed since it was written "
                             f"({rec.get('input') or {}} -> {inputs[i] or {}}), and its record keeps the old ones: "
                             f"give another --out, or move {path} aside to start over")
        done[i] = rec
    return done


def write(path: Path, index: int, rec: dict[str, Any], args: argparse.Namespace) -> None:
    """Append prompt ``index``'s record ``rec`` to ``path`` with this run's settings, durably."""
    append_record(path, {**rec, "index": index, "settings": settings(args)})


def divergence(where: dict[str, Any] | None) -> str:
    """A greedy difference, said as ``--compare`` prints it: where, and whether the target's top two logits tie
    there (the only place exact decoding may part: a forward over a tree and one over a token round differently)."""
    if where is None:  # one output is a prefix of the other: one stopped early
        return "NO (one output stops where the other goes on)"
    said = (f"NO, from new token {where['position']} ({where['tokens'][1]} here, {where['tokens'][0]} from HF), "
            f"where the target's top two logits are {where['top2_gap']:.4g} apart")
    if where["near_tie"]:
        return f"{said}: a tie at the precision its products round at (either token is its argmax)"
    return f"{said}: NOT a tie (a bug; please report it with this command)"
