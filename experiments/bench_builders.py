"""Tree builders benchmarked: build time of the Sequoia DP, and measured versus predicted tau.

Build time (default):

    python experiments/bench_builders.py --budgets 16 32 64 128 256 512 768 \
        --max-depth 20 --max-width 32 --out experiments/results/builders_build_time.md

Times ``tree_builders.sequoia`` (an exact DP, ``O(depth * width * budget^2)``) under a fixed,
synthetic but measured-looking positional acceptance vector, and under a per-depth matrix, and
writes a Markdown table (budget, seconds, expected tokens, depth, size). The functions are
importable (``time_builds`` returns the rows) so that other benchmarks can reuse them.

Measured versus predicted tau (``--real``, or ``--tiny`` for in-process tiny models):

    flock /tmp/treespec-real.lock python experiments/bench_builders.py --real \
        --calib 0:100 --eval 100:164 --eval-budgets 8 16 --temperatures 0 1

On the real Qwen2.5-Coder pair (1.5B target, 0.5B draft), acceptance vectors are measured on the
HumanEval prompts ``--calib`` (the target's own continuations, ``treespec.acceptance.measure``),
then each builder's tree at each budget is run by ``treespec.generate`` on the disjoint prompts
``--eval``; measured tau (with its standard error clustered by prompt) is set against the tau the
vector predicts. Builders at one budget: ``sequoia`` (the DP under the vector), ``kary`` (the best
SpecInfer expansion config, widths per level with at least one level wider than 1, within the
budget), ``independent_chains`` (the best k >= 2 chains of equal length within the budget) and
``chain`` (budget - 1 drafted tokens); plus the target alone for tokens/s. At temperature 0 the
draft proposes top-k children; above 0 it samples (``--sample-mode``). Rows are appended to a JSONL
file as they finish (calibration per prompt too), so a rerun with the same settings resumes; the
Markdown table and a JSON summary are rewritten at the end.

The defaults (``--calib 0:20 --eval 100:104``) take about 45 minutes on a 2-core CPU; the full study
above about 9 hours there (calibration ~28 s per prompt and temperature, evaluation ~25 s per
prompt and tree for 64 tokens).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Sequence

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from tree_builders import TreeShape, chain, greedy_best_first, independent_chains, kary, sequoia  # noqa: E402
from tree_builders.shape import Acceptance  # noqa: E402


def default_acceptance(width: int = 32) -> np.ndarray:
    """A decreasing positional acceptance vector shaped like measured ones (top-1 ~0.6, long tail).

    Synthetic: the first entries are typical of a small draft model against a 1-7B target; the
    tail decays geometrically. Sums to < 1 (the rest is the probability that no child matches).
    """
    head = [0.6, 0.15, 0.07, 0.04, 0.025, 0.015, 0.01, 0.008, 0.006, 0.005]
    tail = [0.004 * 0.8**i for i in range(max(0, width - len(head)))]
    return np.asarray((head + tail)[:width], dtype=np.float64)


def default_matrix(width: int = 32, rows: int = 8) -> np.ndarray:
    """A per-depth matrix: the top-1 acceptance drifts from 0.55 (depth 1) up to ~0.7 deeper,
    the remaining ranks scaled from :func:`default_acceptance` (synthetic, for timing)."""
    base = default_acceptance(width)
    out = np.empty((rows, width))
    for d in range(rows):
        top = min(0.55 + 0.02 * d, 0.7)
        out[d, 0] = top
        out[d, 1:] = base[1:] * (1.0 - top) / (1.0 - base[0])  # keep the same rejection share
    return out


@dataclass
class BuildRow:
    """One timed build."""

    kind: str
    budget: int
    seconds: float
    expected_tokens: float
    depth: int
    size: int
    greedy_expected_tokens: float


def time_builds(
    acceptance: Acceptance,
    budgets: Sequence[int],
    max_depth: int | None = 20,
    max_width: int | None = 32,
    kind: str = "vector",
    repeats: int = 1,
) -> list[BuildRow]:
    """Time ``sequoia(acceptance, budget, max_depth, max_width)`` for each budget (best of
    ``repeats``) and record the optimum's expected tokens, depth and size (plus greedy's value)."""
    rows: list[BuildRow] = []
    for budget in budgets:
        best = float("inf")
        shape = None
        for _ in range(max(1, repeats)):
            t0 = time.perf_counter()
            shape = sequoia(acceptance, budget, max_depth=max_depth, max_width=max_width)
            best = min(best, time.perf_counter() - t0)
        assert shape is not None
        greedy = greedy_best_first(acceptance, budget, max_depth=max_depth, max_width=max_width)
        rows.append(
            BuildRow(
                kind=kind,
                budget=int(budget),
                seconds=best,
                expected_tokens=shape.expected_tokens(acceptance),
                depth=shape.depth,
                size=shape.size,
                greedy_expected_tokens=greedy.expected_tokens(acceptance),
            )
        )
    return rows


def machine_info() -> str:
    """One line describing the machine the timings come from."""
    proc = platform.processor() or platform.machine()
    return (
        f"{platform.system()} {platform.machine()}, processor '{proc}', {os.cpu_count()} CPUs, "
        f"Python {platform.python_version()}, numpy {np.__version__}"
    )


def markdown_table(rows: Sequence[BuildRow]) -> str:
    """A Markdown table of build rows."""
    lines = [
        "| acceptance | budget | seconds | expected tokens | depth | size | greedy best-first tokens |",
        "|---|---:|---:|---:|---:|---:|---:|",
    ]
    for r in rows:
        lines.append(
            f"| {r.kind} | {r.budget} | {r.seconds:.3f} | {r.expected_tokens:.4f} | {r.depth} | {r.size} "
            f"| {r.greedy_expected_tokens:.4f} |"
        )
    return "\n".join(lines)


# --------------------------------------------------------------------------------------------
# Measured versus predicted tau

BUILDERS = ("sequoia", "kary", "independent_chains", "chain")
RESULTS = ROOT / "experiments" / "results"


def parse_range(text: str) -> tuple[int, int]:
    """``"0:100"`` -> ``(0, 100)``."""
    try:
        a, b = (int(x) for x in text.split(":"))
    except ValueError as error:
        raise argparse.ArgumentTypeError(f"expected START:STOP, got {text!r}") from error
    if not 0 <= a < b:
        raise argparse.ArgumentTypeError(f"expected 0 <= START < STOP, got {text!r}")
    return a, b


def best_kary(vector: Sequence[float], budget: int, max_width: int, max_depth: int | None = None) -> TreeShape | None:
    """The SpecInfer expansion config (one width per level) with the most expected tokens under
    ``vector`` and at most ``budget`` nodes; at least one level is wider than 1 (else it is a chain)."""
    best: tuple[float, int, TreeShape] | None = None
    stack: list[tuple[int, ...]] = [()]
    while stack:
        widths = stack.pop()
        size = 1 + int(np.cumprod(widths).sum()) if widths else 1
        if widths and max(widths) > 1:
            shape = kary(widths)
            key = (shape.expected_tokens(vector), -size)
            if best is None or key > best[:2]:
                best = (key[0], key[1], shape)
        if max_depth is None or len(widths) < max_depth:
            level = int(np.prod(widths)) if widths else 1
            stack += [widths + (w,) for w in range(1, max_width + 1) if size + level * w <= budget]
    return None if best is None else best[2]


def best_chains(vector: Sequence[float], budget: int) -> TreeShape | None:
    """``k >= 2`` independent chains of equal length with at most ``budget`` nodes, the best under ``vector``."""
    options = [independent_chains(k, d) for k in range(2, budget) for d in range(1, budget) if 1 + k * d <= budget]
    return max(options, key=lambda s: (s.expected_tokens(vector), -s.size), default=None)


def builder_shapes(vector: Sequence[float], budget: int, width: int, max_depth: int | None = None,
                   builders: Sequence[str] = BUILDERS) -> dict[str, TreeShape]:
    """Each builder's tree with at most ``budget`` nodes (a builder with no such tree is left out).
    ``max_depth`` limits ``sequoia`` and ``kary`` (None: no limit, like the chain's)."""
    make = {
        "sequoia": lambda: sequoia(vector, budget, max_depth=max_depth, max_width=width),
        "kary": lambda: best_kary(vector, budget, width, max_depth),
        "independent_chains": lambda: best_chains(vector, budget),
        "chain": lambda: chain(budget - 1),
    }
    out = {name: make[name]() for name in builders}
    return {k: v for k, v in out.items() if v is not None}


def _read_jsonl(path: Path) -> list[dict]:
    if not path.exists():
        return []
    rows = []
    for line in path.read_text(encoding="utf-8").splitlines():
        if line.strip():
            try:
                rows.append(json.loads(line))
            except json.JSONDecodeError:  # a line cut by an interruption
                continue
    return rows


def _append(path: Path, row: dict) -> None:
    with open(path, "a", encoding="utf-8") as f:
        f.write(json.dumps(row) + "\n")
        f.flush()
        os.fsync(f.fileno())


def evaluate(target: Any, draft: Any, shape: TreeShape | None, prompts: Sequence[Sequence[int]], mode: str,
             temperature: float, max_new_tokens: int, eos: Any, tag: str) -> dict[str, Any]:
    """Run ``generate`` on every prompt; tau from the per-step accepted counts (the last step's cut
    at ``max_new_tokens`` is not counted) with its standard error clustered by prompt."""
    import treespec
    from treespec.sampling import spread_seed

    tokens, steps, agg = [], [], {"new_tokens": 0, "seconds": 0.0, "drafting_seconds": 0.0, "verifying_seconds": 0.0}
    for i, p in enumerate(prompts):
        drafters = [] if shape is None else [treespec.ModelDrafter(draft, shape, mode)]
        out = treespec.generate(target, list(p), drafters=drafters, max_new_tokens=max_new_tokens,
                                temperature=temperature, eos_token_id=eos, seed=spread_seed(tag, i))
        hist = np.array(out.stats.accepted_hist, dtype=np.float64)
        tokens.append(float((np.arange(1, len(hist) + 1) * hist).sum()))
        steps.append(float(hist.sum()))
        agg["new_tokens"] += out.stats.new_tokens
        agg["seconds"] += out.stats.seconds
        agg["drafting_seconds"] += out.stats.drafting_seconds
        agg["verifying_seconds"] += out.stats.verifying_seconds
    t, s = np.array(tokens), np.array(steps)
    tau = float(t.sum() / s.sum())
    k = len(prompts)
    se = float(np.sqrt(((t - tau * s) ** 2).sum() / (k * (k - 1))) / s.mean()) if k > 1 else float("nan")
    return {"tau": tau, "se": se, "steps": int(s.sum()), **agg,
            "tokens_per_second": agg["new_tokens"] / agg["seconds"] if agg["seconds"] else 0.0}


def calibrate(target: Any, draft: Any, prompts: Sequence[Sequence[int]], first: int, config: dict, path: Path,
              mode: str, temperature: float, progress: bool) -> Any:
    """Acceptance over ``prompts`` (indices from ``first``), one prompt at a time; parts measured
    before with the same ``config`` (any range) are read back from ``path``."""
    from treespec.acceptance import Acceptance as Measured
    from treespec.acceptance import measure

    done = {r["prompt"]: Measured.from_dict(r["acceptance"]) for r in _read_jsonl(path)
            if r.get("config") == config and r.get("temperature") == temperature}
    parts = []
    for j, p in enumerate(prompts):
        idx = first + j
        if idx not in done:
            t0 = time.perf_counter()
            done[idx] = measure(target, draft, [p], width=config["width"], mode=mode, temperature=temperature,
                                max_new_tokens=config["calib_tokens"], max_depth=config["matrix_depth"], seed=idx,
                                progress=False, eos_token_id=config["eos"], prompts_label=f"{config['prompts']}[{idx}]")
            _append(path, {"config": config, "temperature": temperature, "prompt": idx,
                           "acceptance": done[idx].to_dict()})
            if progress:
                print(f"  calibration T={temperature:g} prompt {idx}: {done[idx].positions} positions, "
                      f"a[0]={done[idx].vector[0]:.3f} ({time.perf_counter() - t0:.1f}s)", file=sys.stderr, flush=True)
        parts.append(done[idx])
    acc = Measured.merge(parts)
    acc.meta["prompts_label"] = f"{config['prompts']}[{first}:{first + len(prompts)}]"
    return acc


def run_real(target: Any, draft: Any, prompts: Sequence[Sequence[int]], *, calib: tuple[int, int],
             eval_range: tuple[int, int], budgets: Sequence[int] = (8, 16), temperatures: Sequence[float] = (0.0, 1.0),
             builders: Sequence[str] = BUILDERS, width: int = 8, max_depth: int | None = None,
             matrix_depth: int = 15, calib_tokens: int = 64,
             eval_tokens: int = 64, sample_mode: str = "sample_without_replacement", eos: Any = None,
             out_dir: Path = RESULTS, prefix: str = "builders_real", prompts_name: str = "humaneval",
             baseline: bool = True, progress: bool = True) -> list[dict]:
    """Measured versus predicted tau for each (temperature, budget, builder); returns the rows.

    ``prompts`` holds every prompt (token ids) indexed by ``calib`` and ``eval_range``. Rows and
    calibration parts append to ``{prefix}.jsonl`` / ``{prefix}_calib.jsonl`` under ``out_dir`` and
    are reused by a rerun with the same settings; ``{prefix}.md`` and ``{prefix}.json`` are rewritten.
    """
    from treespec.acceptance import model_name

    out_dir.mkdir(parents=True, exist_ok=True)
    rows_path, calib_path = out_dir / f"{prefix}.jsonl", out_dir / f"{prefix}_calib.jsonl"
    config = {"target": model_name(target), "draft": model_name(draft), "prompts": prompts_name,
              "calib": list(calib), "eval": list(eval_range), "width": width, "max_depth": max_depth,
              "matrix_depth": matrix_depth,
              "calib_tokens": calib_tokens, "eval_tokens": eval_tokens, "sample_mode": sample_mode,
              "eos": eos if eos is None or isinstance(eos, int) else list(eos)}
    calib_cfg = {k: config[k] for k in ("target", "draft", "prompts", "width", "matrix_depth", "calib_tokens", "eos")}
    done = {tuple(r["key"]): r for r in _read_jsonl(rows_path) if r.get("config") == config}
    evals = prompts[eval_range[0] : eval_range[1]]
    rows: list[dict] = []
    accs: dict[str, dict] = {}
    for temperature in temperatures:
        temperature = float(temperature)
        mode = "topk" if temperature == 0 else sample_mode
        cfg = {**calib_cfg, "mode": mode}
        acc = calibrate(target, draft, prompts[calib[0] : calib[1]], calib[0], cfg, calib_path, mode, temperature,
                        progress)
        accs[f"{temperature:g}"] = acc.to_dict()
        acc.save(out_dir / f"{prefix}_acceptance_T{temperature:g}.json")
        if progress:
            print(f"T={temperature:g} {mode}: {acc}", file=sys.stderr, flush=True)
        plan: list[tuple[str, int, TreeShape | None]] = [("target", 1, None)] if baseline else []
        for budget in budgets:
            plan += [(name, budget, shape) for name, shape in
                     builder_shapes(acc.vector, budget, width, max_depth, builders).items()]
        measured: dict[tuple, dict] = {}  # paths -> row: a builder whose tree another one already ran reuses it
        for name, budget, shape in plan:
            key = (temperature, name, budget)
            sh = shape if shape is not None else TreeShape()
            if key in done and done[key].get("paths") == [list(p) for p in sh.paths]:
                rows.append(done[key])
                measured.setdefault(sh.paths, done[key])
                continue
            t0 = time.perf_counter()
            twin = measured.get(sh.paths)
            if twin is not None:
                res = {k: twin[k] for k in ("tau", "se", "steps", "new_tokens", "seconds", "drafting_seconds",
                                            "verifying_seconds", "tokens_per_second")}
                res["same_tree_as"] = f"{twin['builder']} {twin['budget']}"
            else:
                res = evaluate(target, draft, shape, evals, mode, temperature, eval_tokens, eos,
                               tag=f"eval/{temperature:g}/{name}/{budget}")
            row = {"key": list(key), "config": config, "temperature": temperature, "mode": mode if shape else "-",
                   "builder": name, "budget": budget, "size": sh.size, "depth": sh.depth, "widths": list(sh.widths),
                   "paths": [list(p) for p in sh.paths], "predicted_tau": sh.expected_tokens(acc.vector),
                   "predicted_tau_matrix": sh.expected_tokens(acc.matrix), **res, "wall_seconds": time.perf_counter() - t0}
            measured.setdefault(sh.paths, row)
            _append(rows_path, row)
            rows.append(row)
            if progress:
                print(f"  T={temperature:g} {name} budget {budget}: tau {res['tau']:.3f} +- {res['se']:.3f} "
                      f"(predicted {row['predicted_tau']:.3f}), {res['tokens_per_second']:.2f} tok/s "
                      f"({row['wall_seconds']:.0f}s)", file=sys.stderr, flush=True)
    report = real_report(rows, config, accs)
    (out_dir / f"{prefix}.md").write_text(report, encoding="utf-8")
    (out_dir / f"{prefix}.json").write_text(json.dumps({"config": config, "machine": machine_info(),
                                                        "acceptance": accs, "rows": rows}, indent=1), encoding="utf-8")
    return rows


def real_report(rows: Sequence[dict], config: dict, accs: dict[str, dict]) -> str:
    """Markdown: configuration, the acceptance vectors, and one line per (temperature, budget, builder)."""
    lines = [
        "# Measured versus predicted tau, by tree builder",
        "",
        f"Target `{config['target']}`, draft `{config['draft']}`; calibration prompts {config['prompts']}"
        f"[{config['calib'][0]}:{config['calib'][1]}] ({config['calib_tokens']} target tokens each), evaluation "
        f"prompts {config['prompts']}[{config['eval'][0]}:{config['eval'][1]}] ({config['eval_tokens']} new tokens "
        f"each). Width {config['width']} (children per node at most), tree depth limit {config['max_depth']} "
        f"(sequoia and kary; None = none), per-depth matrix rows {config['matrix_depth']}.",
        "",
        f"Machine: {machine_info()}",
        "",
        "Predicted tau: the tree's expected tokens under the measured positional vector (and under the "
        "per-depth matrix); measured tau: committed tokens per step from the engine's per-step accepted "
        "counts, +- one standard error clustered by prompt; z = (measured - predicted) / SE (the "
        "calibration's own error is not included). Speedup: tokens/s over the target alone at the same "
        "temperature (wall clock, this machine). A builder whose tree equals an earlier row's is not run "
        "again: its row repeats that measurement.",
        "",
    ]
    for t, a in accs.items():
        vec = ", ".join(f"{x:.3f}" for x in a["vector"])
        lines.append(f"- T={t} ({a['meta'].get('mode')}): a = [{vec}], beta {a['beta']:.3f}, "
                     f"{a['positions']} positions, rows' sample sizes {a['totals']}")
    lines += ["", "| T | mode | builder | budget | size | depth | predicted tau | predicted (matrix) | measured tau "
              "| z | tok/s | speedup | same tree as |", "|---:|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|"]
    base = {r["temperature"]: r["tokens_per_second"] for r in rows if r["builder"] == "target"}
    for r in rows:
        se = r["se"]
        ok = se is not None and np.isfinite(se) and se > 0
        z = f"{(r['tau'] - r['predicted_tau']) / se:+.1f}" if ok else "-"
        sp = f"{r['tokens_per_second'] / base[r['temperature']]:.2f}" if base.get(r["temperature"]) else "-"
        lines.append(f"| {r['temperature']:g} | {r['mode']} | {r['builder']} | {r['budget']} | {r['size']} | {r['depth']} "
                     f"| {r['predicted_tau']:.3f} | {r['predicted_tau_matrix']:.3f} | {r['tau']:.3f} +- {se:.3f} "
                     f"| {z} | {r['tokens_per_second']:.2f} | {sp} | {r.get('same_tree_as', '')} |")
    return "\n".join(lines) + "\n"


def tiny_pair(vocab: int = 256) -> tuple[Any, Any, list[list[int]]]:
    """The tiny in-process pair of ``tests/test_acceptance.py`` and 200 random prompts."""
    sys.path.insert(0, str(ROOT / "tests"))
    from tiny import perturbed_copy, tiny_model

    target = tiny_model("llama", vocab=vocab, hidden=64, scale=6, seed=0)
    rng = np.random.default_rng(123)
    return target, perturbed_copy(target, 0.2), [rng.integers(0, vocab, 5).tolist() for _ in range(200)]


def real_pair(stop: int) -> tuple[Any, Any, list[list[int]], Any]:
    """The default Qwen2.5-Coder pair, HumanEval prompts ``0:stop`` as token ids and the EOS ids."""
    from treespec.acceptance import encode_prompts
    from treespec.models import DEFAULT_DRAFT, DEFAULT_TARGET, check_tokenizers, humaneval_prompts, load

    target, tok = load(DEFAULT_TARGET)
    draft, dtok = load(DEFAULT_DRAFT)
    check_tokenizers(tok, dtok)
    eos = target.generation_config.eos_token_id
    if eos is None:
        eos = tok.eos_token_id
    return target, draft, encode_prompts(tok, humaneval_prompts(0, stop)), eos


def sweep_tau_table(results: Path) -> str:
    """Measured vs predicted tau per (temperature, budget, builder) from a ``treespec sweep`` JSONL.

    Predictions use the acceptance vector the sweep measured on its calibration prompts; the
    measurements come from its evaluation prompts (disjoint). Speedup is over the target alone
    (HF generate) measured in the same run.
    """
    from treespec.experiments import read_records

    recs = [r for r in read_records(results) if r.get("status") == "ok" and r["params"]["kind"] == "treespec"
            and r["params"]["drafters"] == "model" and r["result"].get("predicted_tau") is not None]
    if not recs:
        raise SystemExit(f"no treespec records with a predicted tau in {results}")
    p0 = recs[0]["params"]
    calib = next(r["params"]["acceptance"]["calib"] for r in recs if r["params"].get("acceptance"))
    lines = [f"# Measured vs predicted tau at equal budgets (from `{results}`)", "",
             f"Target {p0['target']}, draft {p0['draft']}; calibration prompts {p0['dataset']}"
             f"[{calib[0]}:{calib[1]}] (acceptance vectors), evaluation prompts "
             f"[{p0['eval'][0]}:{p0['eval'][1]}], {p0['max_new_tokens']} tokens each.", "",
             "| T | budget | builder | tree size | depth | predicted tau | measured tau | measured / predicted |"
             " tok/s | vs target alone |",
             "|---:|---:|---|---:|---:|---:|---:|---:|---:|---:|"]
    for r in sorted(recs, key=lambda r: (r["params"]["temperature"], r["params"]["budget"], r["params"]["builder"])):
        p, res = r["params"], r["result"]
        lines.append(f"| {p['temperature']:g} | {p['budget']} | {p['builder']} | {res['tree']['size']} | "
                     f"{res['tree']['depth']} | {res['predicted_tau']:.2f} | {res['tau']:.2f} | "
                     f"{res['tau'] / res['predicted_tau']:.2f} | {r['timing']['tokens_per_second']:.2f} | "
                     f"{(r.get('speedup') or {}).get('target', float('nan')):.2f} |")
    return "\n".join(lines) + "\n"


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--budgets", type=int, nargs="+", default=[16, 32, 64, 128, 256, 512, 768])
    ap.add_argument("--max-depth", type=int, default=20, help="depth limit (-1: none)")
    ap.add_argument("--max-width", type=int, default=32, help="children per node limit (-1: none)")
    ap.add_argument("--kinds", nargs="+", choices=["vector", "matrix"], default=["vector", "matrix"])
    ap.add_argument("--repeats", type=int, default=3, help="best of this many builds per budget")
    ap.add_argument("--out", type=Path, default=None, help="write the Markdown report here")
    real = ap.add_argument_group("measured versus predicted tau (--real or --tiny)")
    real.add_argument("--real", action="store_true", help="the Qwen2.5-Coder pair on HumanEval (wrap in flock)")
    real.add_argument("--tiny", action="store_true", help="the same on in-process tiny models (random prompts)")
    real.add_argument("--calib", type=parse_range, default=(0, 20),
                      help="calibration prompts START:STOP (default 0:20; the full study uses 0:100)")
    real.add_argument("--eval", type=parse_range, default=(100, 104),
                      help="evaluation prompts START:STOP (default 100:104; the full study uses 100:164)")
    real.add_argument("--eval-budgets", type=int, nargs="+", default=[8, 16])
    real.add_argument("--temperatures", type=float, nargs="+", default=[0.0, 1.0])
    real.add_argument("--builders", nargs="+", choices=BUILDERS, default=list(BUILDERS))
    real.add_argument("--width", type=int, default=8, help="proposals per position (acceptance vector length)")
    real.add_argument("--tree-depth", type=int, default=None, help="depth limit of sequoia and kary (default none)")
    real.add_argument("--matrix-depth", type=int, default=15, help="rows of the measured per-depth matrix")
    real.add_argument("--calib-tokens", type=int, default=64, help="target tokens per calibration prompt")
    real.add_argument("--eval-tokens", type=int, default=64, help="new tokens per evaluation prompt")
    real.add_argument("--sample-mode", default="sample_without_replacement",
                      choices=["topk", "sample", "sample_without_replacement"], help="drafting mode when T > 0")
    real.add_argument("--no-baseline", action="store_true", help="skip the target-alone rows")
    real.add_argument("--out-dir", type=Path, default=RESULTS)
    real.add_argument("--prefix", default=None, help="file name prefix (default builders_real / builders_tiny)")
    real.add_argument("--threads", type=int, default=None, help="torch threads (default: 1 with --tiny, else torch's)")
    real.add_argument("--from-sweep", type=Path, default=None, metavar="JSONL",
                      help="tabulate measured vs predicted tau of the static builders from a sweep's results")
    args = ap.parse_args(argv)
    if args.from_sweep is not None:
        report = sweep_tau_table(args.from_sweep)
        print(report)
        if args.out is not None:
            args.out.write_text(report)
        return 0
    if args.real or args.tiny:
        if args.real and args.tiny:
            ap.error("choose one of --real and --tiny")
        import torch

        if args.threads or args.tiny:
            torch.set_num_threads(args.threads or 1)
        stop = max(args.calib[1], args.eval[1])
        if args.tiny:
            target, draft, prompts = tiny_pair()
            eos, name = None, "random"
        else:
            target, draft, prompts, eos = real_pair(stop)
            name = "humaneval"
        if stop > len(prompts):
            ap.error(f"only {len(prompts)} prompts: --calib/--eval must stop by then")
        if max(args.calib) > args.eval[0] and min(args.calib) < args.eval[1]:
            ap.error("--calib and --eval must not overlap (predictions come from disjoint prompts)")
        rows = run_real(target, draft, prompts, calib=args.calib, eval_range=args.eval, budgets=args.eval_budgets,
                        temperatures=args.temperatures, builders=args.builders, width=args.width,
                        max_depth=args.tree_depth, matrix_depth=args.matrix_depth, calib_tokens=args.calib_tokens,
                        eval_tokens=args.eval_tokens,
                        sample_mode=args.sample_mode, eos=eos, out_dir=args.out_dir,
                        prefix=args.prefix or ("builders_tiny" if args.tiny else "builders_real"),
                        prompts_name=name, baseline=not args.no_baseline)
        print((args.out_dir / f"{args.prefix or ('builders_tiny' if args.tiny else 'builders_real')}.md").read_text())
        return 0 if rows else 1
    max_depth = None if args.max_depth < 0 else args.max_depth
    max_width = None if args.max_width < 0 else args.max_width
    width = max_width or 32

    rows: list[BuildRow] = []
    accs: dict[str, np.ndarray] = {"vector": default_acceptance(width), "matrix": default_matrix(width)}
    for kind in args.kinds:
        rows += time_builds(accs[kind], args.budgets, max_depth, max_width, kind=kind, repeats=args.repeats)

    vec = accs["vector"]
    report = "\n".join(
        [
            "# Sequoia DP build time",
            "",
            f"`tree_builders.sequoia(acceptance, budget, max_depth={max_depth}, max_width={max_width})`, "
            f"best of {args.repeats} build(s) per budget.",
            "",
            f"Machine: {machine_info()}",
            "",
            "Acceptance (synthetic, measured-looking): vector a[:10] = "
            + ", ".join(f"{x:g}" for x in vec[:10])
            + f", ... ({len(vec)} ranks, sum {vec.sum():.3f}); matrix: per-depth rows, top-1 from "
            "0.55 (depth 1) to 0.69 (depth 8 and deeper), other ranks scaled from the vector.",
            "Expected tokens include the bonus token (tau). 'greedy best-first tokens' is "
            "`greedy_best_first` at the same budget and limits, for comparison.",
            "",
            markdown_table(rows),
            "",
        ]
    )
    print(report)
    if args.out is not None:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(report)
        print(f"wrote {args.out}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
