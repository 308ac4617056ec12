"""The launch and sync budget of a decoding step, measured without a GPU (torch.profiler on CPU).

Counts, per step of ``treespec.generate``, the operators dispatched OUTSIDE compiled graphs (each is
a kernel launch on a GPU; inside a captured graph a whole region is one replay) and the host reads
of tensor values (``.tolist()``, ``.item()``, ``.cpu()``, ``bool/int/float(tensor)``: each a
device-to-host copy and a sync on a GPU), split by where they happen (drafting, the rest). The goal of the captured
step (issue "the whole step on the device"): no
eager operator besides the graph call(s) and one copy of the accepted tokens per step.

    python experiments/profile_step.py --out experiments/results/step-profile-cpu.md
"""

from __future__ import annotations

import argparse
import contextlib
import sys
from collections import Counter
from pathlib import Path
from typing import Iterator

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # runs from a checkout

import torch  # noqa: E402
from torch.profiler import ProfilerActivity, profile, record_function  # noqa: E402

import treespec  # noqa: E402
from treespec.core import captured, captured_runner  # noqa: E402
from treespec.common.machine import cpu_model  # noqa: E402
from treespec.models.tiny import perturbed_copy, tiny_model  # noqa: E402

#: Tensor methods that read values to the host (a device-to-host copy and a sync on a GPU)
HOST_READS = ("tolist", "item", "cpu", "__bool__", "__int__", "__float__", "__index__")
REGION = "Torch-Compiled Region"
_section = ["other"]


def count(prof) -> Counter:
    """Top-level aten operators outside compiled regions, per labelled section."""
    ops = Counter()
    for e in prof.events():
        if not e.name.startswith("aten::"):
            continue
        chain, p = [], e.cpu_parent
        while p is not None:
            chain.append(p.name)
            p = p.cpu_parent
        if any(n.startswith(REGION) or n.startswith("aten::") for n in chain):
            continue  # inside a graph, or not top level (launched by another operator)
        ops[next((n for n in chain if n.startswith("section:")), "section:other")[len("section:"):]] += 1
    return ops


@contextlib.contextmanager
def host_reads() -> Iterator[Counter]:
    """Count calls of :data:`HOST_READS` per section while the block runs (methods patched, then restored)."""
    reads, saved = Counter(), {name: getattr(torch.Tensor, name) for name in HOST_READS}

    def counted(name):
        def read(self, *args, **kwargs):
            reads[_section[0]] += 1
            return saved[name](self, *args, **kwargs)
        return read

    for name in HOST_READS:
        setattr(torch.Tensor, name, counted(name))
    try:
        yield reads
    finally:
        for name, method in saved.items():
            setattr(torch.Tensor, name, method)


def labelled(obj, method: str, section: str) -> None:
    """Wrap ``obj.method`` in a profiler label, to attribute its operators and reads to ``section``."""
    inner = getattr(obj, method)

    def call(*args, **kwargs):
        _section[0] = section
        try:
            with record_function(f"section:{section}"):
                return inner(*args, **kwargs)
        finally:
            _section[0] = "other"

    setattr(obj, method, call)


#: the routes a step can take: (label, compile, whether the drafter may be captured, its confidence stop)
ROUTES = (("eager", False, False, None), ("compiled, drafted on the host (aot_eager)", "aot_eager", False, None),
          ("captured (aot_eager)", "aot_eager", True, None),
          ("captured with the confidence stop 0.05 (aot_eager; CPU only)", "aot_eager", True, 0.05))


def measure(compile, capture: bool, temperature: float, new_tokens: int, stop: float | None = None) -> dict:
    target = tiny_model("llama", vocab=64, hidden=64, scale=6)
    draft = perturbed_copy(target, 0.3)
    shape = [(0,), (1,), (0, 0), (0, 1), (1, 0), (1, 1), (0, 0, 0)]
    real_plan = captured.capturable
    captured.capturable = real_plan if capture else (lambda req: "drafted on the host for this profile")
    real_draft = captured_runner.CapturedRunner.draft_tree

    def run(n: int, prof: bool):
        drafter = treespec.ModelDrafter(draft, shape, "topk" if temperature == 0 else "sample_without_replacement",
                                        min_confidence=stop)
        if prof:
            labelled(drafter, "propose", "drafting")
        return treespec.generate(target, [1, 2, 3, 4, 5], [drafter], max_new_tokens=n, budget=8, seed=0,
                                 temperature=temperature, compile=compile)

    try:
        run(8, False)  # warm-up: compiles
        labelled(captured_runner.CapturedRunner, "draft_tree", "drafting")
        with profile(activities=[ProfilerActivity.CPU]) as prof, host_reads() as reads:
            out = run(new_tokens, True)
    finally:
        captured.capturable, captured_runner.CapturedRunner.draft_tree = real_plan, real_draft
    ops = count(prof)
    steps = out.stats.steps
    return {"steps": steps, "ops_per_step": {k: v / steps for k, v in ops.items()},
            "host_reads_per_step": {k: v / steps for k, v in reads.items()}}


def main(argv: list[str] | None = None) -> str:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", type=Path, default=None, help="write the table here (markdown)")
    ap.add_argument("--new-tokens", type=int, default=48)
    args = ap.parse_args(argv)
    lines = [f"# Operators and host reads per decoding step (torch.profiler; {cpu_model()}, "
             f"{torch.get_num_threads()} threads, torch {torch.__version__})", "",
             "Tiny Llama target and draft (vocab 64), a 7-node tree (budget 8; top-k at T=0, sampled without "
             f"replacement at T=1), {args.new_tokens} tokens. `other` = the engine's own work outside drafting "
             "(trie, flattening, padding, acceptance walk, commit). Operators inside compiled graphs are not "
             "counted (a graph call is one replay on a GPU); the captured step's graph calls are its start, one "
             "per depth and its verify.", "",
             "| step | T | eager operators per step (drafting / other) | host reads per step (drafting / other) |",
             "|---|---|---|---|"]
    for name, compile, capture, stop in ROUTES:
        for temperature in (0.0, 1.0):
            r = measure(compile, capture, temperature, args.new_tokens, stop)
            o, s = r["ops_per_step"], r["host_reads_per_step"]
            lines.append(f"| {name} | {temperature:g} | {o.get('drafting', 0):.0f} / {o.get('other', 0):.0f} | "
                         f"{s.get('drafting', 0):.1f} / {s.get('other', 0):.1f} |")
    lines += ["", "Goal of the captured step: 0 eager operators besides the graph calls and 1 host read "
              "(the accepted tokens) per step. With the confidence stop (CPU only) each drafted depth adds the "
              "host's look at its children's path probabilities (an index, a max and a read: free on a CPU, a "
              "sync on a GPU, where such a drafter drafts on the host), and a stop adds the empty rows of the "
              "depths not drafted.", ""]
    text = "\n".join(lines)
    print(text)
    if args.out is not None:
        args.out.write_text(text)
    return text


if __name__ == "__main__":
    main()
