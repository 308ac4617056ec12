"""treespec against llama.cpp on the same GGUF files, on this CPU.

The built-in pair's files (Qwen2.5-Coder-1.5B-Instruct and 0.5B-Instruct, Q4_K_M, assembled from their PyPI
packages), greedy, ``--max-new-tokens`` per prompt, on HumanEval (code, raw prompts) and ShareGPT human first
turns (chat, in the target's chat template). Every method uses ``--threads`` threads. Methods, interleaved per
prompt (``treespec.bench.compare``):

* ``llamacpp``: llama.cpp's plain decoding (``llama-completion``);
* ``llamacpp-speculative-d<N>``: llama.cpp's speculative decoding with the 0.5B file as its draft
  (``llama-speculative-simple``), at the settings found fastest by a small search on prompts disjoint from the
  measured ones (``search.json``): its ``--draft-max`` (``--search-draft-max``) x its threads' polling level
  (``--search-poll``: on 2 cores llama.cpp's default level halved its speed,
  ``treespec.bench.llamacpp.speculative_method``) x its minimum draft probability (``--search-p-min``);
* ``treespec``: what ``treespec generate`` runs by default: the target in the precision whose tuned tree is
  predicted fastest here (``treespec.calibrate.target_precision``: bfloat16, the file dequantised, or int4, the
  file's own 4-bit blocks: Q4_K blocks kept exactly, its Q6_K tensors in bfloat16, its prompt on bfloat16 twins),
  the draft in the precision measured fastest, the tuned tree;
* ``treespec-captured``: ``treespec generate --compile`` (that target, the captured step, inductor weight freezing;
  its compiles are paid in an untimed run of the first prompt, as every treespec method's);
* ``treespec-int4``, ``treespec-bfloat16`` (and ``-captured``): the same with the target in that precision, the
  tree tuned for it.

A llama.cpp method's seconds are its own timers (prompt evaluation + decoding, model load excluded, as
treespec's is; ``treespec.bench.llamacpp``). Speedups are paired per prompt with bootstrap 95% intervals,
with the prompt's prefill and without it (decoding alone). Greedy agreement with llama.cpp's plain output is
the tokens the two outputs share from the start (llama.cpp's text tokenised again). Records are appended as
they finish; a re-run resumes (the search too).

    python experiments/bench_llamacpp.py --llamacpp-bin /path/to/llama.cpp/build/bin \\
        --out experiments/results/llamacpp-cpu

Building llama.cpp: see ``experiments/results/llamacpp-cpu/README.md`` (or ``treespec.bench.llamacpp.BUILD_HINT``).
"""

from __future__ import annotations

import argparse
import ctypes
import ctypes.util
import json
import re
import shlex
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import torch

from treespec.bench import compare, intervals, llamacpp
from treespec.bench.datasets import dataset_prompts, encode_prompt, prompt_range
from treespec.common.jsonl import read_records
from treespec.calibrate import target_precision
from treespec.calibrate.choices import resolve_run
from treespec.calibrate.vectors import default_acceptance
from treespec.common.machine import machine
from treespec.models import DEFAULT_DRAFT, DEFAULT_TARGET, cache_root, load
from treespec.models.packaged import REGISTRY, assemble_gguf, chunk_paths
from treespec.models.precision import precision_of
from treespec.recipes import Recipe, run

TREESPEC = tuple(f"treespec{p}{c}" for p in ("", "-int4", "-bfloat16") for c in ("", "-captured"))


def gguf_file(name: str) -> Path:
    """The built-in model's GGUF file, assembled once from its packages under the treespec cache."""
    spec = REGISTRY[name]
    dest = cache_root() / "gguf" / spec.gguf_file
    if not (dest.is_file() and dest.stat().st_size == spec.size):
        assemble_gguf(chunk_paths(spec), dest, expected_size=spec.size)
    return dest


def prompts_of(tok: Any, ranges: dict[str, str]) -> list[tuple[str, int, list[int]]]:
    out = []
    for name, spec in ranges.items():
        if spec:
            texts = dataset_prompts(name)
            a, b = prompt_range(spec, len(texts), name)
            out += [(name, i, encode_prompt(tok, name, texts[i])) for i in range(a, b)]
    return out


def poll_level(text: str) -> int | None:
    """``--search-poll``'s values: a polling level 0-100, or ``default`` (None: no flag, llama.cpp's own level)."""
    if text == "default":
        return None
    if not text.isdigit() or int(text) > 100:
        raise argparse.ArgumentTypeError(f"{text!r} is no polling level: give 0-100 or 'default'")
    return int(text)


def probability(text: str) -> float:
    """``--search-p-min``'s values: a probability in [0, 1)."""
    try:
        value = float(text)
    except ValueError:
        value = -1.0
    if not 0 <= value < 1:
        raise argparse.ArgumentTypeError(f"{text!r} is no minimum draft probability: give a number in [0, 1)")
    return value


#: a speculative candidate: draft-max (0: plain decoding), polling level (None: llama.cpp's), minimum draft probability
Candidate = tuple[int, int | None, float]


def search_key(candidate: Candidate) -> str:
    """A search candidate's name in ``search.json``: its ``--draft-max`` (0: plain decoding), then its polling level
    where one is set and its minimum draft probability where above 0 (``4``: llama.cpp's defaults;
    ``4-poll0-pmin0.75``)."""
    draft_max, poll, p_min = candidate
    if draft_max == 0:
        return "0"
    return f"{draft_max}" + (f"-poll{poll}" if poll is not None else "") + (f"-pmin{p_min:g}" if p_min else "")


def search_speculative(llama: llamacpp.LlamaCpp, target: Path, draft: Path, tok: Any, prompts, n: int,
                       candidates: list[Candidate], path: Path) -> Candidate:
    """The candidate (``Candidate``: ``llamacpp.speculative_method``'s settings) of llama.cpp's speculative decoding
    fastest on ``prompts`` (mean tok/s; plain decoding among the candidates as draft-max 0, for reference), cached in
    ``path``: a candidate measured before is not run again."""
    found = json.loads(path.read_text()) if path.exists() else {}
    by_key = {search_key(c): c for c in candidates}
    for key, (d, poll, p_min) in by_key.items():
        if key in found:
            continue
        m = (llamacpp.plain_method(llama, target, tok) if d == 0 else
             llamacpp.speculative_method(llama, target, draft, tok, draft_max=d, poll=poll, p_min=p_min))
        m.run(prompts[0][2], compare.WARMUP_TOKENS)
        speeds = []
        for _, _, ids in prompts:
            tokens, seconds, _ = m.run(ids, n)
            speeds.append(len(tokens) / seconds)
        found[key] = statistics.mean(speeds)
        print(f"  search: {search_name(key)}: {found[key]:.2f} tok/s", flush=True)
        path.write_text(json.dumps(found, indent=1))
    speculative = [k for k, c in by_key.items() if c[0] > 0]
    if not speculative:
        raise ValueError("--search-draft-max holds no draft-max above 0: give at least one (e.g. 4)")
    return by_key[max(speculative, key=lambda k: found[k])]


def search_name(key: str) -> str:
    """How the report names a search candidate (``search_key``)."""
    draft_max, poll, p_min = re.fullmatch(r"(\d+)(?:-poll(\d+))?(?:-pmin([\d.]+))?", key).groups()
    return "plain" if draft_max == "0" else " ".join(
        [f"draft-max {draft_max}"] + [f"poll {poll}"] * (poll is not None) + [f"p-min {p_min}"] * (p_min is not None))


def treespec_methods(tok: Any, names: list[str], n: int,
                     prompts: list[tuple[str, int, list[int]]]) -> tuple[list[compare.Method], dict[str, str]]:
    """treespec's methods and the configuration each runs on ``prompts`` (``choices.resolve_run``'s why: what
    ``treespec generate`` runs, with ``--compile`` for a ``-captured`` method, ``--no-compile`` otherwise). Methods
    whose models load in the same precision share them (the captured step's frozen graphs hold their own copy of
    the weights)."""
    loaded: dict[tuple[str, str], torch.nn.Module] = {}

    def model(name: str, role: str, dtype: str, traceable: bool = False) -> torch.nn.Module:
        if (name, dtype) in loaded:
            return loaded[(name, dtype)]
        m, _ = load(name, dtype=dtype, role=role, traceable=traceable)
        m = loaded.setdefault((name, precision_of(m)), m)  # an equal one loaded before wins; this one is freed
        if libc := ctypes.util.find_library("c"):  # loading's float32 copies: back to the system (glibc)
            getattr(ctypes.CDLL(libc), "malloc_trim", lambda _: None)(0)
        return m

    vector, prompt_ids = default_acceptance(None, 0.0), [p for *_, p in prompts]
    methods, why = [], {}
    for name in names:
        captured = name.endswith("-captured")
        asked = name.removesuffix("-captured").removeprefix("treespec").removeprefix("-")
        target = model(DEFAULT_TARGET, "target", asked or default_target_precision())
        drafts = [model(DEFAULT_DRAFT, "draft", "auto", traceable=captured)]
        resolved = resolve_run(Recipe(tree="sequoia", acceptance=vector), target, drafts, tok, prompts=prompt_ids,
                               max_new_tokens=n, compile=captured)
        why[name] = resolved.why
        print(f"{name}: {resolved.why}", flush=True)
        methods.append(compare.treespec_method(
            lambda ids, k, r=resolved.recipe, t=target, d=drafts: run(r, t, d, ids, max_new_tokens=k),
            precision_of(target), name=name))
    return methods, why


def default_target_precision() -> str:
    """The precision ``treespec generate`` runs the built-in target in here (its tuned choice, decided now when this
    machine has not decided it yet)."""
    record = target_precision.cached_choice(DEFAULT_TARGET, DEFAULT_DRAFT)
    if record is None:
        model, _, _ = target_precision.load_pair_tuned(DEFAULT_TARGET, DEFAULT_DRAFT)
        record = model.treespec_precision["tuned_choice"]
    return record["precision"]


def decode_only(records: list[dict], summary: dict) -> dict[str, dict]:
    """Each treespec method's speedup over each llama.cpp method on decoding alone (seconds less prefill)."""
    by = {(r["method"], r["prompt"]): r for r in records if r["dataset"] == summary["dataset"]}
    ps, out = summary["prompts"], {}
    for s, e in summary["methods"].items():
        for b, f in summary["methods"].items():
            if not e["baseline"] and f["baseline"]:
                dec = lambda m: [by[(m, p)]["seconds"] - by[(m, p)]["prefill_seconds"] for p in ps]  # noqa: E731
                out[f"{s} vs {b}"] = intervals.ratio_of_sums(dec(b), dec(s)).as_dict()
    return out


def agreement(records: list[dict], summary: dict, tok: Any, reference: str = "llamacpp") -> dict[str, float]:
    """Mean share of ``reference``'s generated text (llama.cpp's plain greedy output) that each method's output
    reproduces from its start, compared as text (a retokenisation may split tokens differently)."""
    by = {(r["method"], r["prompt"]): r for r in records if r["dataset"] == summary["dataset"]}
    text = lambda r: r.get("llamacpp_text") or tok.decode(r["output"], skip_special_tokens=False)  # noqa: E731
    out = {}
    for m in summary["methods"]:
        if m != reference:
            shares = [llamacpp.common_prefix(text(by[(m, p)]), text(by[(reference, p)]))
                      / max(len(text(by[(reference, p)])), 1) for p in summary["prompts"]]
            out[m] = statistics.mean(shares)
    return out


def command_line(argv: list[str]) -> str:
    """The command a report names: ``argv`` with the llama.cpp build's own path written as a placeholder."""
    path = "<llama.cpp>/build/bin"
    shown = [path if i and argv[i - 1] == "--llamacpp-bin" else f"--llamacpp-bin={path}"
             if a.startswith("--llamacpp-bin=") else shlex.quote(a) for i, a in enumerate(argv)]
    return " ".join(["python experiments/bench_llamacpp.py", *shown])


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--llamacpp-bin", type=Path, required=True, help="llama.cpp's build/bin directory")
    ap.add_argument("--out", type=Path, default=Path("experiments/results/llamacpp-cpu"))
    ap.add_argument("--humaneval", default="150:160", metavar="A:B", help="HumanEval problems A..B-1 ('' to skip)")
    ap.add_argument("--sharegpt", default="20:30", metavar="A:B", help="ShareGPT first turns A..B-1 ('' to skip)")
    ap.add_argument("--search", default="humaneval=140:142,sharegpt=40:42", metavar="D=A:B,...",
                    help="the speculative search's prompts (disjoint from the measured ones)")
    ap.add_argument("--search-draft-max", type=int, nargs="+", default=[0, 2, 4, 8, 16],
                    help="llama.cpp --draft-max candidates (0: plain decoding, for reference)")
    ap.add_argument("--search-poll", type=poll_level, nargs="+", default=[None, 0], metavar="LEVEL",
                    help="llama.cpp --poll candidates for speculative decoding, each with every draft-max: 0-100, or "
                         "'default' (no flag: llama.cpp's 50); default: default 0")
    ap.add_argument("--search-p-min", type=probability, nargs="+", default=[0.0, 0.75], metavar="P",
                    help="llama.cpp --spec-draft-p-min candidates (drafting stops under this probability; 0: "
                         "llama.cpp's default), each with every draft-max and polling level; default: 0 0.75")
    ap.add_argument("--max-new-tokens", type=int, default=64)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--treespec", nargs="+", choices=TREESPEC, default=list(TREESPEC),
                    help="treespec's methods to run (one added to a finished --out runs after the others)")
    argv = sys.argv[1:] if argv is None else argv
    args = ap.parse_args(argv)
    llamacpp.find_binaries(args.llamacpp_bin)  # says how to build the tools when they are missing
    args.out.mkdir(parents=True, exist_ok=True)
    torch.set_num_threads(args.threads)
    if any(name.endswith("-captured") for name in args.treespec):
        torch._inductor.config.freezing = True
    target_file, draft_file = gguf_file(DEFAULT_TARGET), gguf_file(DEFAULT_DRAFT)
    _, tok = load(DEFAULT_TARGET, dtype="bfloat16", role="target")
    llama = llamacpp.LlamaCpp(args.llamacpp_bin, args.threads)
    search = prompts_of(tok, dict(s.split("=") for s in args.search.split(",") if s))
    grid = [(d, p, m) for d in args.search_draft_max for p in args.search_poll for m in args.search_p_min]
    best = search_speculative(llama, target_file, draft_file, tok, search, args.max_new_tokens, grid,
                              args.out / "search.json")
    prompts = prompts_of(tok, {"humaneval": args.humaneval, "sharegpt": args.sharegpt})
    mine, why = treespec_methods(tok, args.treespec, args.max_new_tokens, prompts)
    methods = [llamacpp.plain_method(llama, target_file, tok),
               llamacpp.speculative_method(llama, target_file, draft_file, tok, draft_max=best[0], poll=best[1],
                                           p_min=best[2]), *mine]
    for m in mine:  # compiles and one-off setup, paid before the timed prompts: a whole first prompt, untimed
        t = time.perf_counter()
        m.run(prompts[0][2], args.max_new_tokens)
        print(f"{m.name} warm-up: {time.perf_counter() - t:.1f} s", flush=True)
    results, summary_file = args.out / "results.jsonl", args.out / "summary.json"
    before = {r["method"] for r in read_records(results)} if results.exists() else set()
    earlier = json.loads(summary_file.read_text()) if summary_file.exists() else {}
    new = {m.name for m in methods} - before if before else set()
    added_later = sorted(set(earlier.get("added_later", [])) | new)
    why = {**earlier.get("configurations", {}), **why}
    records = compare.run(methods, prompts, args.max_new_tokens, results, settings={"threads": args.threads},
                          on_record=lambda r: print(
        f"  {r['dataset']}/{r['prompt']} {r['method']}: {r['tokens_per_second']:.2f} tok/s", flush=True))
    summaries = [compare.summarize(records, d) for d in dict.fromkeys(p[0] for p in prompts)]
    result = {"machine": machine("cpu"), "torch": torch.__version__, "threads": args.threads,
              "llamacpp_version": llamacpp.version(args.llamacpp_bin), "files": [target_file.name, draft_file.name],
              "speculative_search": json.loads((args.out / "search.json").read_text()), "speculative": search_key(best),
              "configurations": why, "added_later": added_later, "max_new_tokens": args.max_new_tokens,
              "command": command_line(argv), "summaries": summaries,
              "decode_only": {s["dataset"]: decode_only(records, s) for s in summaries},
              "agreement_with_llamacpp": {s["dataset"]: agreement(records, s, tok) for s in summaries}}
    summary_file.write_text(json.dumps(result, indent=1))
    report(result, args)
    compare.plot(summaries, args.out / "tokens_per_second.png")
    return result


def report(result: dict, args: argparse.Namespace) -> None:
    parts = []
    for s in result["summaries"]:
        d = s["dataset"]
        lines = [compare.markdown(s, who="llama.cpp"), "",
                 "| decoding alone (prefill excluded), paired | ratio [95% CI] |", "|---|---|"]
        lines += [f"| {k} | {compare.fmt(iv)}x |" for k, iv in result["decode_only"][d].items()]
        lines += ["", "Share of llama.cpp's plain greedy text each output reproduces from its start: " + ", ".join(
            f"{m} {v:.0%}" for m, v in result["agreement_with_llamacpp"][d].items()) + "."]
        parts.append("\n".join(lines))
    search = ", ".join(f"{search_name(k)} {v:.2f}" for k, v in result["speculative_search"].items())
    kept = search_name(result["speculative"])
    text = (f"# treespec against llama.cpp on the same GGUF files, CPU\n\nMachine: {result['machine']}, torch "
            f"{result['torch']}, {result['threads']} threads for every method. Files: {', '.join(result['files'])}. "
            f"{result['max_new_tokens']} greedy tokens per prompt, methods interleaved per prompt"
            + (f" (except {', '.join(result['added_later'])}: added by a later run, after the others)"
               if result["added_later"] else "") + ".\n\n"
            f"llama.cpp's speculative search (mean tok/s on the search prompts): {search}; kept: {kept}.\n\n"
            "treespec's configurations: "
            + "; ".join(f"{k}: {v}" for k, v in result["configurations"].items())
            + f".\n\nllama.cpp: {result['llamacpp_version']}, built like this (at that commit):\n\n"
            f"```\n{llamacpp.BUILD}\n```\n\n"
            f"Command: `{result['command']}`.\n\n"
            + "\n\n".join(parts) + "\n")
    (args.out / "README.md").write_text(text)
    print(text)


if __name__ == "__main__":
    main()
