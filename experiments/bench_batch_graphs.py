"""What a batch's captured step costs to compile and to run, by batch size.

Every row's acceptance is one walk over the batch (``treespec.core.rule``'s walks run over ``[B, ...]``), so the
captured step's graphs should compile in about the same seconds whatever the number of rows, and a step's
seconds per row should fall as rows share its calls. This measures both on tiny random models (no downloads):
for each backend and batch size, a fresh set of runners (``captured.RUNNERS`` cleared) makes its first call
(compiles, kept apart as ``first_s``), then ``--calls`` timed calls of the same batch (``call_s``: the median),
and the graphs dynamo compiled for it. Sampled (T=1), draws without replacement under ``rrs``: the walk with the
most per-row work. Records are appended to ``results.jsonl`` as they finish (a re-run resumes).

    python experiments/bench_batch_graphs.py --out experiments/results/batch-graphs-cpu
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # runs from a checkout without installing treespec

import torch  # noqa: E402

import treespec  # noqa: E402
from treespec.common.machine import machine  # noqa: E402
from treespec.core import captured  # noqa: E402
from treespec.core.buffers import Envelope  # noqa: E402
from treespec.core.compiling import graphs_compiled  # noqa: E402
from treespec.models.tiny import perturbed_copy, tiny_model  # noqa: E402

TREE = [(0,), (1,), (2,), (0, 0), (0, 1), (1, 0), (0, 0, 0)]


def measure(backend: str, rows: int, calls: int, tokens: int) -> dict:
    """One backend and batch size: the first call's seconds (compiles), the median of ``calls`` more."""
    target = tiny_model("llama", vocab=64, hidden=64, layers=2, scale=6, seed=0)
    draft = perturbed_copy(target, 0.3)
    prompts = [[1 + r % 7, 5, 7, 9, 3] for r in range(rows)]
    kw = dict(max_new_tokens=tokens, temperature=1.0, compile=backend, envelope=Envelope.for_shapes([TREE]))

    def call(seed: int) -> float:
        start = time.perf_counter()
        out = treespec.generate(target, prompts, [treespec.ModelDrafter(draft, TREE, "sample_without_replacement")],
                                seed=seed, **kw)
        assert out.stats.step == "captured, batched", out.stats.step
        return time.perf_counter() - start

    captured.RUNNERS.clear()
    graphs = graphs_compiled()
    first = call(0)
    compiled = graphs_compiled() - graphs
    timed = [call(1 + i) for i in range(calls)]
    return {"backend": backend, "rows": rows, "tokens_per_row": tokens, "first_s": first, "graphs": compiled,
            "call_s": statistics.median(timed), "call_s_per_row": statistics.median(timed) / rows}


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", type=Path, required=True, help="folder for results.jsonl and README.md")
    ap.add_argument("--backends", nargs="+", default=["eager", "inductor"],
                    help="torch.compile backends ('eager': dynamo's tracing alone; 'inductor': with freezing)")
    ap.add_argument("--rows", type=int, nargs="+", default=[1, 8, 32], help="batch sizes")
    ap.add_argument("--calls", type=int, default=5, help="timed calls after the first")
    ap.add_argument("--tokens", type=int, default=16, help="new tokens per row and call")
    args = ap.parse_args(argv)
    torch.set_num_threads(1)  # tiny models: threads add overhead
    args.out.mkdir(parents=True, exist_ok=True)
    path = args.out / "results.jsonl"
    done = {(r["backend"], r["rows"]) for r in map(json.loads, path.read_text().splitlines())} if path.exists() \
        else set()
    for backend in args.backends:
        for rows in args.rows:
            if (backend, rows) in done:
                continue
            record = measure(backend, rows, args.calls, args.tokens)
            print(json.dumps(record), flush=True)
            with path.open("a") as f:
                f.write(json.dumps(record) + "\n")
    records = [json.loads(line) for line in path.read_text().splitlines()]
    lines = ["# The captured batch step's compile and call seconds by batch size", "",
             f"Machine: {machine('cpu')}, torch {torch.__version__}. Command: "
             f"`python experiments/bench_batch_graphs.py --out {args.out}`",
             "(tiny random llama, 2 layers, vocabulary 64; a 7-node tree, draws without replacement, T=1; one "
             "thread).",
             "", "| backend | rows | first call s (compiles) | graphs | call s (median) | call s per row |",
             "|---|---|---|---|---|---|"]
    lines += [f"| {r['backend']} | {r['rows']} | {r['first_s']:.2f} | {r['graphs']} | {r['call_s']:.3f} | "
              f"{r['call_s_per_row']:.4f} |" for r in records]
    (args.out / "README.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
