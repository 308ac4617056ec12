"""Every admitted model family on every route a run can take, against HF's own greedy decoding of a tiny random model
of the family (float32): the eager step (a chain, a bushy tree, a Sequoia-like tree; three prompts), a batch, the
captured step uncompiled and compiled by inductor (with weight freezing, as a CPU run compiles), and drafts in int8
and int4 (the target in float32: still the target's own tokens) and a bfloat16 target (runs). CI checks the fast
routes (``tests/test_families.py``); this adds inductor and the precisions, a minute or so a family on two cores.

One record per family is appended to ``<out>/results.jsonl`` as it finishes (a re-run skips the families done);
``README.md`` tabulates them with the machine.

    python experiments/check_families.py --out experiments/results/families-cpu
    python experiments/check_families.py --out /tmp/f --families gemma phi3 --no-inductor
"""

from __future__ import annotations

import argparse
import copy
import sys
import time
import traceback
from pathlib import Path
from typing import Callable

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from a checkout without installing

import treespec  # noqa: E402
from tree_builders import chain, kary, sequoia  # noqa: E402
from treespec.common.jsonl import append_record, read_records, repair_tail  # noqa: E402
from treespec.common.machine import machine  # noqa: E402
from treespec.core.checks import SUPPORTED_FAMILIES  # noqa: E402
from treespec.core.compiling import UNCOMPILED  # noqa: E402
from treespec.models.precision import fused_weights, to_precision  # noqa: E402
from treespec.models.tiny import greedy_reference, perturbed_copy, tiny_family_model  # noqa: E402

PROMPTS = [[5, 9, 13, 2, 7, 30, 11, 4], [3], [1, 4, 1, 5, 9, 2, 6, 5, 3, 5, 8, 9, 7, 9, 33, 60]]
TOKENS = 24
TREES = {"chain": chain(5), "kary": kary((3, 2, 2)), "sequoia": sequoia([0.6, 0.2, 0.1, 0.05], 16)}
ROUTES = ("eager", "batch", "captured", "inductor", "int8 draft", "int4 draft", "bfloat16 target")


def routes(family: str, inductor: bool) -> dict[str, Callable[[], str]]:
    """Each route's check for ``family``: a callable returning "pass" or what parted from HF."""
    target = tiny_family_model(family)
    draft = perturbed_copy(target, 0.1)
    want = {tuple(p): greedy_reference(target, p, TOKENS) for p in PROMPTS}

    def run(model, d, shape, prompt, **kw):
        return treespec.generate(model, prompt, [treespec.ModelDrafter(d, shape, "topk")], max_new_tokens=TOKENS,
                                 **kw)

    def parted(pairs) -> str:
        bad = [label for label, got, ref in pairs if got != ref]
        return "pass" if not bad else "parted: " + ", ".join(bad)

    def eager() -> str:
        return parted((f"{t}/prompt {i}", run(target, draft, s, p).new_tokens, want[tuple(p)])
                      for t, s in TREES.items() for i, p in enumerate(PROMPTS))

    def batch() -> str:
        out = treespec.generate(target, PROMPTS, [treespec.ModelDrafter(draft, TREES["kary"], "topk")],
                                max_new_tokens=TOKENS)
        return parted((f"row {i}", row.new_tokens, want[tuple(p)]) for i, (p, row) in enumerate(zip(PROMPTS, out.rows)))

    def captured(backend) -> Callable[[], str]:
        def check() -> str:
            outs = [(f"{t}/prompt {i}", run(target, draft, TREES[t], p, compile=backend), want[tuple(p)])
                    for t in ("chain", "sequoia") for i, p in enumerate(PROMPTS[:2])]
            if any(o.stats.step != "captured" for _, o, _ in outs):
                return "not captured: " + outs[0][1].stats.step
            return parted((label, o.new_tokens, ref) for label, o, ref in outs)
        return check

    def quantised(precision: str) -> Callable[[], str]:
        def check() -> str:
            if fused_weights(draft):  # refused by to_precision: they would stay float32 in an "int8" model
                return "refused"
            d = to_precision(copy.deepcopy(draft), precision)
            return parted((f"prompt {i}", run(target, d, TREES["sequoia"], p).new_tokens, want[tuple(p)])
                          for i, p in enumerate(PROMPTS))
        return check

    def bfloat16_target() -> str:
        t = to_precision(copy.deepcopy(target), "bfloat16")
        out = run(t, to_precision(copy.deepcopy(draft), "bfloat16"), TREES["kary"], PROMPTS[0])
        return "runs" if len(out.new_tokens) == TOKENS else f"{len(out.new_tokens)} tokens"

    checks = {"eager": eager, "batch": batch, "captured": captured(UNCOMPILED), "inductor": captured(True),
              "int8 draft": quantised("int8"), "int4 draft": quantised("int4"), "bfloat16 target": bfloat16_target}
    if not inductor:
        checks["inductor"] = lambda: "not run"
    return checks


def check_family(family: str, inductor: bool) -> dict:
    """One family's record: each route's outcome and seconds (an exception is its one-line outcome)."""
    record: dict = {"family": family}
    try:
        checks = routes(family, inductor)
    except Exception as e:  # noqa: BLE001 - a family that cannot be built is a result too
        return {**record, "error": f"{type(e).__name__}: {e}"}
    for name, check in checks.items():
        start = time.perf_counter()
        try:
            record[name] = check()
        except Exception as e:  # noqa: BLE001
            last = traceback.extract_tb(e.__traceback__)[-1]
            record[name] = f"{type(e).__name__}: {str(e).splitlines()[0][:120]} ({Path(last.filename).name}:" \
                           f"{last.lineno})"
        record[f"{name} seconds"] = round(time.perf_counter() - start, 1)
    return record


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", type=Path, required=True, help="a directory: results.jsonl and README.md")
    ap.add_argument("--families", nargs="+", default=list(SUPPORTED_FAMILIES), metavar="FAMILY",
                    help="model types to check (default: every admitted one)")
    ap.add_argument("--no-inductor", action="store_true", help="skip the compiled route (the slow one)")
    args = ap.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    results = args.out / "results.jsonl"
    repair_tail(results)
    done = {r["family"] for r in read_records(results)}
    for family in args.families:
        if family in done:
            continue
        record = check_family(family, not args.no_inductor)
        append_record(results, record)
        print(" | ".join(f"{k}: {v}" for k, v in record.items() if not k.endswith("seconds")), flush=True)
    records = {r["family"]: r for r in read_records(results)}
    import transformers

    lines = [f"# Model families on every route ({machine('cpu')}, torch {torch.__version__}, transformers "
             f"{transformers.__version__})", "",
             "Greedy output of a tiny random model of each family against HF `generate` (float32; "
             "`python experiments/check_families.py --out ...`): `pass` where every prompt and tree gave HF's tokens; "
             "`refused`: int8/int4 refused for a model whose fused expert weights they would leave in float32.",
             "", "| family | " + " | ".join(ROUTES) + " | seconds |", "|---" * (len(ROUTES) + 2) + "|"]
    for family, r in records.items():
        cells = [r.get("error", "")] * len(ROUTES) if "error" in r else [str(r.get(k, "")) for k in ROUTES]
        seconds = sum(v for k, v in r.items() if k.endswith("seconds"))
        lines.append(f"| {family} | " + " | ".join(cells) + f" | {seconds:.0f} |")
    (args.out / "README.md").write_text("\n".join(lines) + "\n")
    bad = [f for f, r in records.items() if "error" in r or any(
        str(r.get(k)) not in ("pass", "runs", "not run", "refused") for k in ROUTES)]
    print(f"{len(records) - len(bad)} of {len(records)} families pass every route" +
          (f"; not: {', '.join(bad)}" if bad else ""))
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
