"""How long the built-in pair's quantised layers take to build on this CPU, and what the two levers of that build
give: converting a weight ``CHUNK_ROWS`` rows at a time (``treespec.models.quantized``: the chunk's float32 rows
stay in the CPU's caches) against the whole weight at once, and converting layers on torch's threads against one
at a time (fbgemm's packing runs on one core).

Each part starts from the float32 model as ``load`` reads it from the cache and builds the layers ``load`` builds:
``target-int4`` the target's layers from its GGUF file's blocks (``gguf_blocks.with_file_blocks``: Q4_K blocks on the
int4 kernel with bfloat16 twins, Q6_K tensors int8 per row; where prompts run on the kernels, ``treespec.models.twin``,
``load`` now builds no twins, and less), ``draft-int8`` the draft's ``quantize_int8``,
``draft-int4`` its ``quantize_int4`` (int8 twins). The two settings alternate, ``--rounds`` times; the layers each
builds are compared by a digest of every buffer (they must be identical). Each build runs in a process of its own,
as a user's ``load`` does: in one long process a second build of the whole weights reuses memory the first one
faulted in, and ran 10.2 s against 17.5 s for the first (the target, here).

Run with this script on the Zen 3 host (AMD EPYC, family 25 model 1), alone, 2 rounds, 6 min 11 s; best of 2,
whole weights on one thread -> chunks on torch's threads: target-int4 13.67 -> 6.76 s (the rounds: 15.26 / 13.67
against 7.47 / 6.76), draft-int8 11.22 -> 6.60 s (11.33 / 11.22 against 7.25 / 6.60), draft-int4 16.46 -> 9.90 s
(16.46 / 18.19 against 10.29 / 9.90); identical layers in every part. End to end, ``treespec generate --prompt
"def quicksort(xs):" --max-new-tokens 32 --json`` (int4 target, int8 draft here), alternated with the code before
(3cf32c8): 50.10 / 50.66 s -> 33.64 / 35.10 s from start to exit, the same tokens.

    python experiments/layer_build_seconds.py [--rounds 2] [--parts target-int4 draft-int8 draft-int4]
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import json
import subprocess
import sys
import time
from typing import Callable, Iterator

import torch

from treespec.common.machine import cpu_model
from treespec.models import DEFAULT_DRAFT, DEFAULT_TARGET, load, quantized
from treespec.models.gguf_blocks import with_file_blocks
from treespec.models.packaged import REGISTRY, file_int4_blocks

SETTINGS = {"whole weights, one thread": (10**9, 1), "chunks, torch's threads": (quantized.CHUNK_ROWS, None)}


@contextlib.contextmanager
def chunk_rows(rows: int) -> Iterator[None]:
    kept = quantized.CHUNK_ROWS
    quantized.CHUNK_ROWS = rows
    try:
        yield
    finally:
        quantized.CHUNK_ROWS = kept


def float32(name: str) -> torch.nn.Module:
    return load(name, dtype=torch.float32, linear_layout="stock")[0]


def build_target(threads: int | None) -> tuple[torch.nn.Module, float]:
    model = float32(DEFAULT_TARGET)
    blocks = file_int4_blocks(REGISTRY[DEFAULT_TARGET], model)
    start = time.perf_counter()
    with_file_blocks(model, blocks)  # the target's layers one at a time (their ops use torch's threads)
    return model, time.perf_counter() - start


def build_draft(convert: Callable[[torch.nn.Module, int | None], torch.nn.Module]):
    def build(threads: int | None) -> tuple[torch.nn.Module, float]:
        model = float32(DEFAULT_DRAFT)
        start = time.perf_counter()
        convert(model, threads)
        return model, time.perf_counter() - start
    return build


PARTS = {"target-int4": build_target,
         "draft-int8": build_draft(lambda m, threads: quantized.quantize_int8(m, threads=threads)),
         "draft-int4": build_draft(lambda m, threads: quantized.quantize_int4(m, threads=threads))}


def buffers(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """Every tensor a built model holds, the twins' and torch.ao's packed weights included."""
    out = dict(model.state_dict())
    for name, module in model.named_modules():
        wide = getattr(module, "wide", None)
        if wide is not None:
            out.update({f"{name}.wide.{k}": v for k, v in wide.state_dict().items()})
    return {k: (v.int_repr() if v.is_quantized else v) for k, v in out.items() if isinstance(v, torch.Tensor)}


def digest(model: torch.nn.Module) -> str:
    h = hashlib.sha256()
    for name, tensor in sorted(buffers(model).items()):
        h.update(name.encode())
        h.update(tensor.contiguous().view(-1).view(torch.uint8).numpy().tobytes())
    return h.hexdigest()[:16]


def child(part: str, label: str) -> None:
    rows, threads = SETTINGS[label]
    with chunk_rows(rows):
        model, took = PARTS[part](threads)
    print(json.dumps({"seconds": took, "digest": digest(model)}))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--parts", nargs="+", choices=list(PARTS), default=list(PARTS))
    ap.add_argument("--child", nargs=2, metavar=("PART", "SETTING"), help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        return child(*args.child)
    print(f"{cpu_model()}, {torch.get_num_threads()} threads, torch {torch.__version__}", flush=True)
    for part in args.parts:
        seconds: dict[str, list[float]] = {label: [] for label in SETTINGS}
        digests = set()
        for round_ in range(args.rounds):
            for label in SETTINGS:
                done = subprocess.run([sys.executable, __file__, "--child", part, label], capture_output=True,
                                      text=True, check=True)
                result = json.loads(done.stdout.strip().splitlines()[-1])
                seconds[label].append(result["seconds"])
                digests.add(result["digest"])
                print(f"{part} round {round_ + 1}, {label}: {result['seconds']:.2f} s", flush=True)
        print(f"{part}: " + "; ".join(f"{label} {min(s):.2f} s (best of {len(s)})" for label, s in seconds.items())
              + f"; layers identical: {len(digests) == 1}", flush=True)


if __name__ == "__main__":
    main()
