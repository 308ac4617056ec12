"""``treespec sweep``: run or resume a sweep from a TOML config, list its points, or write its report. The options
are parsed before the sweep's modules (and torch) are imported: ``--help`` answers at once."""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path
from typing import Sequence

from ...common.files import check_writable
from ...common.options import TARGET_PRECISIONS
from .paths import REPLACED, RESULTS


def main(argv: Sequence[str] | None = None) -> int:
    """``treespec sweep --config experiments/configs/NAME.toml [--out DIR] [--device D] [--dtype T]``
    or ``treespec sweep --report results.jsonl``."""
    ap = _parser()
    args = ap.parse_args(argv)
    if args.report is not None:
        return _report_only(ap, args)
    if args.config is None:
        ap.error("give --config CONFIG.toml (or --report RESULTS_JSONL)")
    if args.max_minutes is not None and not args.max_minutes > 0:
        ap.error(f"--max-minutes must be > 0, got {args.max_minutes}")
    if args.workers is not None and args.workers < 0:
        ap.error(f"--workers must be >= 0 (0: in this process), got {args.workers}")
    if args.dry_run:
        return _dry_run(args)
    if args.out is not None:
        check_writable(args.out, directory=True)
    from .loop import sweep

    failed: list[dict] = []

    def keep_failed(record: dict) -> None:
        if record["status"] != "ok":
            failed.append(record)

    results = sweep(args.config, args.out, progress=not args.no_progress, device=args.device, dtype=args.dtype,
                    max_minutes=args.max_minutes, new=args.new, skip_corrupt=args.skip_corrupt, workers=args.workers,
                    ray_address=args.ray_address, share_cpu=args.share_cpu, on_point=keep_failed)
    print(results)
    print(results.parent / "README.md")
    refused = [r for r in failed if r.get("refused")]
    if len(failed) > len(refused):  # the errors were printed as they came, and stand in results.jsonl and the README
        n = len(failed) - len(refused)
        print(f"treespec sweep: {n} point{'s' * (n > 1)} failed (errors above and in the README); run the same "
              f"command again to retry them", file=sys.stderr)
    if refused:
        print(f"treespec sweep: {len(refused)} point{'s' * (len(refused) > 1)} refused: the verifier is not exact "
              "for the point's tree (NotExactError), or runs on the host only under run.compile (Refused; errors "
              "above and in the README), which a re-run does not change; take that verifier or tree out of the grid "
              "(--dry-run names such points where the config alone tells)", file=sys.stderr)
    return 1 if failed else 0


def _parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(
        prog="treespec sweep",
        description="Run (or resume) a tree-budget sweep from a TOML config, with HF baselines measured in the same "
                    "run, and write results.jsonl, plots and README.md. Re-running skips finished points. One sweep at "
                    "a time writes an output directory (a lock file names the writer), and a directory keeps the "
                    "config its results came from (config.json): a changed config needs --new or another --out (a "
                    "change of the grid's axes alone resumes, keeping the finished points). Exits 1 when a point "
                    "failed (its error is recorded; the same command again retries it).")
    ap.add_argument("--config", type=Path, help="TOML config, e.g. experiments/configs/cpu-qwen-coder.toml")
    ap.add_argument("--out", type=Path, default=None,
                    help="output directory (default experiments/results/<name>; with --report: where the plots and "
                         "README.md go, default beside the results file)")
    ap.add_argument("--device", default=None,
                    help="torch device for both models, e.g. cpu or cuda (overrides run.device)")
    ap.add_argument("--dtype", choices=TARGET_PRECISIONS, default=None,
                    help="the target's precision (overrides run.dtype; int4: a CPU's, the GGUF file's own blocks)")
    ap.add_argument("--report", type=Path, default=None, metavar="RESULTS_JSONL",
                    help="only write plots and README.md for an existing results.jsonl")
    ap.add_argument("--dry-run", action="store_true",
                    help="list the points (and which are finished) and the compile plan, and exit")
    ap.add_argument("--no-progress", action="store_true", help="no progress bar")
    ap.add_argument("--max-minutes", type=float, default=None, metavar="M",
                    help="start no new point after M minutes (run a long sweep in slices; re-run to resume)")
    ap.add_argument("--new", action="store_true",
                    help=f"start over: the earlier results in --out are moved (not deleted) into "
                         f"--out/{REPLACED}<UTC time>/. Needed when --out holds the results of a different config "
                         f"(without it such a directory is refused); without a change it re-measures everything")
    ap.add_argument("--workers", type=int, default=None, metavar="N",
                    help="run the points on N Ray workers, one device each (a GPU each on a GPU node; default "
                         "run.workers, 0 = in this process); needs pip install 'treespec[ray]'")
    ap.add_argument("--ray-address", default=None, metavar="ADDR",
                    help="join an existing Ray cluster (e.g. one started with `ray start --head`) instead of "
                         "a local one")
    ap.add_argument("--share-cpu", action="store_true",
                    help="allow several CPU workers on one machine (they slow each other: timings are distorted, and "
                         "the records say shared_cpu)")
    ap.add_argument("--skip-corrupt", action="store_true",
                    help="skip corrupt lines of results.jsonl (each is named on stderr) instead of stopping there")
    return ap


def _report_only(ap: argparse.ArgumentParser, args: argparse.Namespace) -> int:
    extra = [f"--{k.replace('_', '-')}" for k in ("config", "device", "dtype", "dry_run", "max_minutes", "new",
                                                   "workers", "ray_address", "share_cpu")
             if getattr(args, k) not in (None, False)]
    if extra:
        ap.error(f"--report only writes the report of an existing results file; it takes no {', '.join(extra)}")
    if not args.report.is_file():
        ap.error(f"--report {args.report}: no such results file (give the results.jsonl of a sweep)")
    from .report import report

    print(report(args.report, args.out, skip_corrupt=args.skip_corrupt))
    return 0


def _dry_run(args: argparse.Namespace) -> int:
    from .config import check_cpu_precisions, check_device_available, check_types, load_config
    from .lock import refusal
    from .models import check_specs
    from .points import compile_plan, enumerate_points, finished, measure_key, model_specs
    from .records import read_records

    cfg = load_config(args.config)
    if args.device:
        cfg["run"]["device"] = args.device
    if args.dtype:
        cfg["run"]["dtype"] = args.dtype
    check_types(cfg)  # the overrides too
    check_cpu_precisions(cfg)
    out = args.out or Path("experiments") / "results" / cfg["name"]
    why = refusal(out, cfg) if out.is_dir() and not args.new else None
    try:  # what a run checks before any model loads (the output's writability below, creating nothing)
        check_device_available(cfg["run"]["device"])
    except ValueError as error:
        why = why or str(error)
    why = why or _unwritable(out)
    if why:
        print(f"note: a run would be refused: {why}", file=sys.stderr)
    finished_points = {} if args.new else finished(read_records(out / RESULTS, args.skip_corrupt))
    points = enumerate_points(cfg)
    done = {pt.key for pt in points if measure_key(pt.params) in finished_points}
    try:
        check_specs(model_specs([pt for pt in points if pt.key not in done]))
    except (ValueError, OSError, ImportError) as error:
        print(f"note: a run would be refused: {error}", file=sys.stderr)
    refused = {pt.key: found for pt in points if pt.key not in done and (found := _refusal(pt.params))}
    for pt in points:
        print(f"{'done' if pt.key in done else 'todo'}  {pt.key}  {pt.label}"
              + (f"  (refused: {refused[pt.key][0]})" if pt.key in refused else ""))
    kinds = {k: sum(pt.kind == k for pt in points) for k in ("baseline", "treespec")}
    print(f"{len(points)} points ({kinds['baseline']} baselines, {kinds['treespec']} treespec), "
          f"{len(done)} finished" + (f", {len(refused)} refused" if refused else ""))
    whys = [why for _, why in refused.values()]
    for why in sorted(set(whys)):
        print(f"note: a run would record {whys.count(why)} point(s) as refused without running them: {why}",
              file=sys.stderr)
    print("\n".join(compile_plan(cfg, [pt for pt in points if pt.key not in refused])))
    return 0


def _unwritable(out: Path) -> str | None:
    """Why a run could not write its output directory ``out`` (``check_writable``'s refusals), found without
    creating it; None when it could."""
    if out.exists() and not out.is_dir():
        return f"--out {out} is a file, not a directory; give a directory (a sweep writes several files there)"
    parent = next(p for p in (out, *out.parents) if p.exists())
    return None if os.access(parent, os.W_OK) else f"--out {out} is not writable ({parent} is not)"


def _refusal(params: dict) -> tuple[str, str] | None:
    """What ``--dry-run`` lists for a point a run records as refused without running it, and why; else None. Checked
    in the order the run checks them (``runner.Sweep.run_point``)."""
    from .points import compile_refusal, verifier_refusal

    why = compile_refusal(params)
    if why:
        return "verifier runs on the host only, not compiled", why
    why = verifier_refusal(params)
    return ("verifier not exact for this tree", why) if why else None
