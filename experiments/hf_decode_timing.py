"""How steady HF's own decoding time is on this host: the profile's timing (``measure_plain_decode``, 128 random
tokens x 12, and at HumanEval 100's length x 24) beside HF ``generate`` on HumanEval 100 (65 tokens less 1 token, per
token) and treespec's one-token forward, ``--rounds`` rounds back to back, the built-in target (``dtype="auto"``).

Run at 80ec6f9 on the Zen 4 host, alone, 3 rounds: 0.209 / 0.284 / 0.266, 0.259 / 0.244 / 0.282, 0.272 / 0.226 /
0.262, 0.277 / 0.316 / 0.202 s per token (each column's three rounds), HF's prefill + 1 token 2.30 / 3.12 / 2.71 s.

``--interleaved``: whether running the demo's other methods between them changes HF eager's decoding. Each round
times ``measure_plain_decode`` (128 x 12 and 128 x 48), then HF eager on HumanEval 100 (64 tokens; its decoding
seconds per token, prefill excluded, ``compare.hf_method``'s stamps) alone twice, after HF static + compile +
freezing, and after HF assisted with the int4 draft. Run at 93315b8 on the Zen 4 host, alone, 3 rounds (s per
token): timed 0.237 / 0.232 / 0.178 (x 48: 0.231 / 0.230 / 0.183); HF eager alone 0.248, 0.213 / 0.233, 0.229 /
0.182, 0.185; after compiled 0.233 / 0.230 / 0.190; after assisted 0.232 / 0.218 / 0.187; HF's prefill 2.13-2.20 s
in every run. No effect of the interleaving; the timing follows HF's decoding within a round, and the host's speed
stepped from ~0.23 to ~0.18 s per token within a minute between rounds 2 and 3 while the compute-bound prefill held:
memory bandwidth shared with the host's other tenants.

    python experiments/hf_decode_timing.py --rounds 3 [--interleaved]
"""

from __future__ import annotations

import argparse
import time

import torch

from treespec.bench import compare
from treespec.bench.baselines import hf_generate
from treespec.bench.datasets import humaneval_prompts
from treespec.models.loading import DEFAULT_DRAFT, DEFAULT_TARGET, load
from treespec.models.timing import measure_latency, measure_plain_decode


def back_to_back(t: torch.nn.Module, ids: list[int], rounds: int) -> None:
    for r in range(rounds):
        a = measure_plain_decode(t)
        b = measure_plain_decode(t, context=len(ids), tokens=24)
        _, s1 = hf_generate(t, ids, 1)
        _, s65 = hf_generate(t, ids, 65)
        c = measure_latency(t, [1], context=128, repeats=3)[1]
        print(r, f"timed@128x12 {a:.3f}", f"timed@{len(ids)}x24 {b:.3f}", f"hf (65-1)/64 {(s65 - s1) / 64:.3f}",
              f"prefill+1 {s1:.2f}", f"t(1) {c:.3f}", flush=True)


def interleaved(t: torch.nn.Module, ids: list[int], rounds: int) -> None:
    draft, _ = load(DEFAULT_DRAFT, dtype="auto", role="draft")
    eager, compiled = compare.hf_method(t), compare.hf_compiled_method(t)
    assisted = compare.hf_assisted_method(t, draft)

    def hf_eager(label: str) -> None:
        _, seconds, record = eager.run(ids, 64)
        print(f"{time.strftime('%H:%M:%S')} {label}: HF eager {(seconds - record['prefill_seconds']) / 63:.3f} s per "
              f"token, prefill {record['prefill_seconds']:.2f} s", flush=True)

    compiled.run(ids, 4)  # its compiles, untimed
    for r in range(rounds):
        print(f"{time.strftime('%H:%M:%S')} round {r}: timed@128x12 {measure_plain_decode(t):.3f}, "
              f"timed@128x48 {measure_plain_decode(t, tokens=48):.3f}", flush=True)
        hf_eager("alone")
        hf_eager("alone again")
        compiled.run(ids, 64)
        hf_eager("after HF static + compile")
        assisted.run(ids, 64)
        hf_eager("after HF assisted")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--interleaved", action="store_true", help="HF eager alone and between the demo's other methods")
    args = ap.parse_args()
    torch.set_num_threads(2)
    t, tok = load(DEFAULT_TARGET, dtype="auto", role="target")
    ids = tok(humaneval_prompts(100, 101)[0])["input_ids"]
    (interleaved if args.interleaved else back_to_back)(t, ids, args.rounds)


if __name__ == "__main__":
    main()
