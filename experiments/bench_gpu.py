"""GPU protocol: costs, tok/s and the predicted speedup of the real Qwen2.5-Coder pair, in phases.

The real weights cannot travel to a GPU node, so the models are built with random weights from the
real pair's configs (1.5B target, 0.5B draft). GPU time is scarce, so the protocol runs in phases,
each one command well under 10 minutes, each writing ``results.json`` and ``README.md`` the moment it
ends (a crash later loses nothing; a phase run again replaces only its own entry):

* ``first``: a tiny model, ``compile=True`` on the device with the real backend (inductor, and CUDA
  graphs on CUDA), greedy, against eager treespec and HF greedy, in float32. A compiled-step bug
  of the CUDA-graph class shows here in seconds, before minutes of compiles.
* ``costs``: the target's tree forward t(n), eager for n = 1..128 and compiled for a few sizes, and
  the draft's cost per tree level, eager and compiled.
* ``hf``: HF ``generate``, eager and with a static cache + ``torch.compile``.
* ``treespec``: seconds per step of Sequoia trees (``--step-budgets``; the DP trees of the shipped T=0
  acceptance's per-depth rows) captured (``compile=True``), and eager at the first budget (``--no-eager``: not),
  each with a ``torch.profiler`` count of launches, copies and syncs per step and the device's busy time per step;
  saved after every run. A random draft: a step costs the same whatever is accepted, so the real
  pair's tok/s is predicted from the shapes' tau at report time.
* ``validate``: float32 (bf16 random logits have near-ties): draft = target, the share of steps
  accepting the whole chain, eager and compiled, and compiled == eager greedy output; a weak draft
  (the target's first layers, perturbed: varying acceptance), compiled == eager == HF greedy.
* ``predict``: the real pair's speedup predicted from the measured costs and the shipped
  acceptance's per-depth rows (``treespec/data/acceptance-*.json``) through ``treespec.calibrate.costs``;
  needs ``costs`` and ``hf``. Predicted, NOT measured: the README says which is which.

    python experiments/bench_gpu.py --out experiments/results/gpu-h100 --phase first      # seconds
    python experiments/bench_gpu.py --out experiments/results/gpu-h100 --phase costs      # then hf, ...
    python experiments/bench_gpu.py --smoke --out /tmp/bench-smoke --phase all            # tiny, CPU

The phases and their parts: ``experiments/gpu_protocol/``; this script is the command.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "experiments")]  # runs from a checkout without installing treespec

import torch  # noqa: E402

from gpu_protocol.bench import PHASES, Bench, hf_fastest, hf_generate_frozen  # noqa: E402
from gpu_protocol.levers import LEVERS, lever, phase_levels, sdpa_backends  # noqa: E402
from gpu_protocol.phases import (phase_costs, phase_first, phase_hf, phase_predict, phase_treespec,  # noqa: E402
                                 phase_validate)
from gpu_protocol.report import merged, save  # noqa: E402
from gpu_protocol.sweep import phase_sweep, sweep_lever  # noqa: E402

# the command, and the parts tests/test_bench_gpu.py reads from this script's namespace
__all__ = ["LEVERS", "PHASES", "hf_fastest", "hf_generate_frozen", "lever", "main", "merged", "sdpa_backends",
           "sweep_lever"]


def main(argv: list[str] | None = None) -> dict[str, Any]:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", required=True, help="directory for results.json and README.md (resumed)")
    ap.add_argument("--phase", choices=(*PHASES, "all"), nargs="+", default=["all"],
                    help="which phases to run, in the protocol's order (default: all)")
    ap.add_argument("--smoke", action="store_true",
                    help="tiny models (CPU by default), dynamo's eager backend (whole graphs traced and replayed; the "
                         "suite's compiled-step tests check AOT and inductor): checks the script")
    ap.add_argument("--device", default=None, help="default: cuda if available, else cpu")
    ap.add_argument("--prompts", type=int, default=4)
    ap.add_argument("--prompt-len", type=int, default=128)
    ap.add_argument("--new-tokens", type=int, default=128)
    ap.add_argument("--budget", type=int, default=32, help="tree budget of the treespec tok/s runs")
    ap.add_argument("--compiled-sizes", type=int, nargs="+", default=[1, 2, 4, 8, 16, 32, 64, 128],
                    help="tree sizes whose compiled forward phase costs times (one compile each); 0: none")
    ap.add_argument("--no-eager", action="store_true", help="phase treespec: captured steps only")
    ap.add_argument("--repeats", type=int, default=10)
    ap.add_argument("--step-budgets", type=int, nargs="+", default=None,
                    help="budgets of the Sequoia trees whose captured steps phase treespec times (default: 16 32 64; "
                         "smoke: 8)")
    ap.add_argument("--max-depth", type=int, default=8, help="depth limit of those trees (the CLI's default)")
    ap.add_argument("--levers", nargs="+", default=None, choices=list(LEVERS), metavar="LEVER",
                    help="phase levels: these levers of LEVERS, in this order (default: all)")
    ap.add_argument("--levels-seconds", type=float, default=None,
                    help="phase levels: the phase's budget: a lever starts only if the phase, with the slowest "
                         "first call (compiles) of a lever so far, ends within it (the rest are named as skipped)")
    ap.add_argument("--sweep-lever", default="default", metavar="LEVER",
                    help="phase sweep: run every shape with this lever of LEVERS (default: treespec's own settings; "
                         "'best': the "
                         "fastest level of phase levels' saved results)")
    ap.add_argument("--sweep-costs", choices=("steps", "dynamic"), default="steps",
                    help="phase sweep: the device's costs from the swept steps alone (default), or also the compiled "
                         "forwards timed alone (dynamic token counts: minutes of compiles on a GPU)")
    ap.add_argument("--sweep-families", nargs="+", default=None, help="phase sweep: only these of SWEEP_FAMILIES")
    ap.add_argument("--clock", choices=("events", "waits"), default="events",
                    help="how treespec's steps time their sections on CUDA: events (the default, no wait) or a wait "
                         "for the device at every section (treespec.core.step.Clock.device_events)")
    ap.add_argument("--trace", action="store_true",
                    help="phase sweep: chrome traces of the device-sized tree's short generate under each clock "
                         "(trace-waits.json.gz, trace-events.json.gz in --out)")
    ap.add_argument("--sweep-budgets", type=int, nargs="+", default=None,
                    help="budgets of phase sweep's tree families (default: 16 32; smoke: 8, three families)")
    args = ap.parse_args(argv)
    args.device = args.device or ("cuda" if torch.cuda.is_available() and not args.smoke else "cpu")
    if args.smoke:
        # prompts under prefill.CHUNKED_MIN tokens prefill eagerly: phase costs compiles no prefill of its own
        # (phase first's longer prompts check the compiled prefill); short generations: the profiled ones (one
        # prompt's) cost seconds per step, and 8 tokens still give draft = target a whole uncut step
        args.prompts, args.prompt_len, args.new_tokens, args.budget, args.repeats = 3, 15, 8, 8, 2
        args.compiled_sizes = [1, 8]
    args.step_budgets = args.step_budgets or ([8] if args.smoke else [16, 32, 64])
    args.sweep_budgets = args.sweep_budgets or ([8] if args.smoke else [16, 32])
    if args.smoke and args.sweep_families is None:
        args.sweep_families = ["sequoia-d8", "chain", "kary-2"]
    args.compiled_sizes = [n for n in args.compiled_sizes if n > 0]
    out = Path(args.out)

    def checkpoint(phase: str, part: dict[str, Any]) -> None:
        """Record a phase's result (or finished part) and save it."""
        results["phases"][phase] = merged(phase, results["phases"].get(phase), part)
        save(out, results)

    from treespec.core.step import Clock
    Clock.device_events = args.clock == "events"
    b = Bench(args, checkpoint)
    results = json.loads((out / "results.json").read_text()) if (out / "results.json").exists() else {}
    results = {"setup": b.setup(), "phases": results.get("phases", {})}
    phases = {"first": phase_first, "costs": phase_costs, "hf": phase_hf, "treespec": phase_treespec,
              "validate": phase_validate, "predict": lambda bench: phase_predict(bench, results["phases"]),
              "sweep": lambda bench: phase_sweep(bench, results["phases"]), "levels": phase_levels}
    threads = torch.get_num_threads()
    if args.smoke:  # tiny models: a second thread only waits on the first (on a busy machine, many times over)
        torch.set_num_threads(1)
    try:
        for name in [p for p in PHASES if "all" in args.phase or p in args.phase]:
            t = time.perf_counter()
            print(f"phase {name} ...", flush=True)
            checkpoint(name, phases[name](b))
            results["phases"][name + "_seconds"] = time.perf_counter() - t
            results["phases"][name + "_settings"] = {k: results["setup"][k] for k in ("prompts", "prompt_len",
                                                                                        "new_tokens")}
            save(out, results)
            print(f"phase {name} done in {time.perf_counter() - t:.0f} s; written to {out}", flush=True)
    finally:
        torch.set_num_threads(threads)
    return results


if __name__ == "__main__":
    main()
