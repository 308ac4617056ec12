"""Does any default of ``treespec generate`` lose to plain decoding? Every drafter the CLI offers, as a user runs it.

Each configuration is one ``treespec generate ... --json --compare`` process on the same HumanEval
prompts (greedy): the CLI resolves its default (the tuned Sequoia tree for the default draft; for
every other drafter a pilot that predicts the fastest depth or plain decoding,
``treespec.calibrate.pilot``), prints why, runs treespec and then HF ``generate`` (the target alone,
eager) on every prompt. A warm-up prompt (HumanEval 99) is run first and left out of the figures.
Per configuration one record is appended to ``<out>/results.jsonl`` as it finishes (a re-run
skips finished ones); ``README.md`` gives tok/s and the speedup over the target alone with a
bootstrap 95% interval over prompts (paired per prompt: HF seconds over treespec seconds), and the configuration line
the CLI printed.

    python experiments/bench_defaults.py --out experiments/results/cli-defaults --prompts 6 --max-new-tokens 64
    python experiments/bench_defaults.py --dataset sharegpt --out experiments/results/cli-defaults-chat --prompts 12 \
        --max-new-tokens 96 --only "default draft (tuned Sequoia)" "default draft, code's acceptance" "plain decoding"

``--dataset sharegpt``: ShareGPT first turns (30-400 characters, from turns 100-399: the shipped chat acceptance was
walked on turns 1000-1099) as user turns in the chat template (``--chat``), what a chat user sends; there the
tuned tree is sized from the chat acceptance, and "default draft, code's acceptance" sizes it from code's (the
default before the chat walk shipped).

Pilots and tuning profiles are cached per machine (``<treespec cache>``): the first run of a
configuration pays for them outside its timed generation; ``--fresh`` removes the pilot cache first.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np
import torch

from treespec.bench import intervals
from treespec.bench.datasets import dataset_prompts, humaneval_prompts
from treespec.calibrate.vectors import shipped_file
from treespec.common.machine import machine
from treespec.models import DEFAULT_DRAFT, cache_root
from treespec.models.packaged import SMOLLM2

ROOT = Path(__file__).resolve().parents[1]
#: label -> extra CLI options (every drafter ``treespec generate`` offers, at its defaults)
CONFIGS = {
    "default draft (tuned Sequoia)": [],
    "n-gram alone": ["--ngram"],
    "default draft + n-gram": ["--draft", DEFAULT_DRAFT, "--ngram"],
    "SmolLM2 (another tokenizer)": ["--draft", SMOLLM2],
    "default draft, dynamic tree": ["--tree", "dynamic"],
    "plain decoding": ["--budget", "1"],
    # the int4 draft's code walk (what --chat ran with before chat's shipped; the automatic draft here is int4)
    "default draft, code's acceptance": ["--acceptance", f"treespec/{shipped_file(0.0, 'int4')}"],
}


def prompts_of(dataset: str, count: int) -> tuple[list[str], str, list[str]]:
    """The warm-up prompt and ``count`` evaluation prompts of ``dataset``, how the README names them, and the CLI
    options they need (``--chat`` for chat turns)."""
    if dataset == "humaneval":
        return humaneval_prompts(99, 100 + count), f"HumanEval 100-{99 + count} (warm-up prompt 99 left out)", []
    turns = [t for t in dataset_prompts("sharegpt")[100:400] if 30 <= len(t) <= 400][: count + 1]
    return (turns, f"the 2nd to {count + 1}th ShareGPT first turns of 30-400 characters from turns 100-399, as user "
                   "turns in the chat template (the 1st, the warm-up, left out)", ["--chat"])


def run_config(label: str, extra: list[str], prompts_file: Path, max_new_tokens: int) -> dict:
    cmd = [sys.executable, "-c", "import sys; from treespec.cli import main; sys.exit(main())", "generate",
           "--prompts-jsonl", str(prompts_file), "--json", "--compare",
           "--seed", "0", "--max-new-tokens", str(max_new_tokens), *extra]
    print(" ".join(cmd[3:]), flush=True)
    done = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT)  # paths in CONFIGS: from the repository
    if done.returncode not in (0, 1):  # 1: a greedy output differed from HF's (recorded, not fatal)
        raise RuntimeError(f"{label}: {' '.join(cmd)} failed:\n{done.stderr[-3000:]}")
    records = [json.loads(line) for line in done.stdout.splitlines() if line.startswith("{")]
    return {"label": label, "options": extra, "records": records[1:],  # the first prompt is the warm-up
            "configuration": records[0]["configuration"] if records else None}


def summarize(rows: list[dict], out: Path, args: argparse.Namespace) -> None:
    named = prompts_of(args.dataset, args.prompts)[1]
    only = "" if args.only is None else " --only " + " ".join(f'"{label}"' for label in args.only)
    lines = [f"# CLI defaults against plain decoding ({machine('cpu')}, torch {torch.__version__})", "",
             f"`treespec generate --json --compare` per configuration, greedy, {named}, "
             f"at most {args.max_new_tokens} new tokens. Speedup: treespec tok/s over HF "
             "`generate` eager (the target alone, same process, same prompt): HF's seconds over treespec's, summed "
             "over prompts, with a paired bootstrap 95% interval. Command: `python experiments/bench_defaults.py "
             f"--dataset {args.dataset} --out {args.out} --prompts {args.prompts} --max-new-tokens "
             f"{args.max_new_tokens}{only}`.", "",
             "*s/step*: measured seconds per step (drafting + verifying + engine), to set beside the seconds per step "
             "the CLI predicted (in its configuration line).", "",
             "| configuration | treespec tok/s | target alone tok/s | speedup [95% CI] | tau | s/step | "
             "greedy = target | "
             "what the CLI chose |", "|---|---|---|---|---|---|---|---|"]
    for row in rows:
        recs = row["records"]
        ts = np.array([r["tokens_per_second"] for r in recs])
        hf = np.array([r["hf_tokens_per_second"] for r in recs])
        tokens = np.array([len(r["new_tokens"]) for r in recs], dtype=float)
        ci = intervals.ratio_of_sums(tokens / hf, tokens / ts).fmt()  # paired per prompt: HF seconds / ours
        same = sum(bool(r.get("identical")) for r in recs)
        steps = sum(r["steps"] for r in recs)
        per_step = (sum(r["drafting_seconds"] + r["verifying_seconds"] + r["engine_seconds"] for r in recs)
                    / max(steps, 1))
        lines.append(f"| {row['label']} (`{' '.join(row['options']) or '(none)'}`) | {ts.mean():.2f} | "
                     f"{hf.mean():.2f} | "
                     f"{ci} | {np.mean([r['tau'] for r in recs]):.2f} | {per_step:.3f} | {same}/{len(recs)} | "
                     f"{row['configuration']} |")
    (out / "README.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--dataset", choices=("humaneval", "sharegpt"), default="humaneval",
                    help="HumanEval prompts from 100 on, or ShareGPT first turns in the chat template (module doc)")
    ap.add_argument("--prompts", type=int, default=6, help="evaluation prompts (default 6)")
    ap.add_argument("--max-new-tokens", type=int, default=64)
    ap.add_argument("--only", nargs="+", choices=list(CONFIGS), default=None, help="configurations to run")
    ap.add_argument("--fresh", action="store_true", help="remove the pilot cache first (pay the pilots again)")
    args = ap.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    if args.fresh:
        (cache_root() / "pilots.json").unlink(missing_ok=True)
    results = args.out / "results.jsonl"
    rows = [json.loads(line) for line in results.read_text().splitlines()] if results.exists() else []
    other = {r.get("dataset", "humaneval") for r in rows} - {args.dataset}
    if other:
        ap.error(f"{results} holds runs on {', '.join(sorted(other))}: give --dataset {args.dataset} another --out")
    done = {r["label"] for r in rows}
    texts, _, options = prompts_of(args.dataset, args.prompts)
    with tempfile.TemporaryDirectory() as tmp:
        prompts_file = Path(tmp) / "prompts.jsonl"
        prompts_file.write_text("".join(json.dumps({"prompt": p}) + "\n" for p in texts))
        for label in args.only or list(CONFIGS):
            if label in done:
                continue
            print(f"{label} ...", flush=True)
            row = {**run_config(label, [*CONFIGS[label], *options], prompts_file, args.max_new_tokens),
                   "dataset": args.dataset,
                   "machine": machine("cpu"), "finished_at": datetime.datetime.now(datetime.timezone.utc).isoformat(),
                   "loadavg": os.getloadavg()}
            with results.open("a") as f:
                f.write(json.dumps(row) + "\n")
            rows.append(row)
    summarize([r for r in rows if r["label"] in CONFIGS], args.out, args)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
