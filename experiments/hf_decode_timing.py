"""How steady HF's own decoding time is on this host: the profile's timing (``measure_plain_decode``, 128 random
tokens x 12, and at HumanEval 100's length x 24) beside HF ``generate`` on HumanEval 100 (65 tokens less 1 token, per
token) and treespec's one-token forward, ``--rounds`` rounds back to back, the built-in target (``dtype="auto"``).

Run at 80ec6f9 on the Zen 4 host, alone, 3 rounds: 0.209 / 0.284 / 0.266, 0.259 / 0.244 / 0.282, 0.272 / 0.226 /
0.262, 0.277 / 0.316 / 0.202 s per token (each column's three rounds), HF's prefill + 1 token 2.30 / 3.12 / 2.71 s.

    python experiments/hf_decode_timing.py --rounds 3
"""

from __future__ import annotations

import argparse

import torch

from treespec.bench.baselines import hf_generate
from treespec.bench.datasets import humaneval_prompts
from treespec.models.loading import DEFAULT_TARGET, load
from treespec.models.timing import measure_latency, measure_plain_decode


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=3)
    args = ap.parse_args()
    torch.set_num_threads(2)
    t, tok = load(DEFAULT_TARGET, dtype="auto", role="target")
    ids = tok(humaneval_prompts(100, 101)[0])["input_ids"]
    for r in range(args.rounds):
        a = measure_plain_decode(t)
        b = measure_plain_decode(t, context=len(ids), tokens=24)
        _, s1 = hf_generate(t, ids, 1)
        _, s65 = hf_generate(t, ids, 65)
        c = measure_latency(t, [1], context=128, repeats=3)[1]
        print(r, f"timed@128x12 {a:.3f}", f"timed@{len(ids)}x24 {b:.3f}", f"hf (65-1)/64 {(s65 - s1) / 64:.3f}",
              f"prefill+1 {s1:.2f}", f"t(1) {c:.3f}", flush=True)


if __name__ == "__main__":
    main()
