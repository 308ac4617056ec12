"""How the suite's statistical tests were sized: the figures quoted beside their sizes in ``tests/``.

    python experiments/size_tests.py quantised   # tests/test_precision_drafters.py: trials per draft noise
    python experiments/size_tests.py cross       # tests/test_cross_tokenizer.py: the negative control's power
    python experiments/size_tests.py tau         # tests/test_acceptance.py: the tau checks at two sizes

``quantised``: trials at which the G-test detects the int8 draft's unverified first token with power 0.99
(``tests/stats.py``), for the draft noises tried. ``cross``: the cross-tokenizer negative control (point masses
passed off as uniform draws) run 6,000 times; its law, as estimated and shrunk a quarter toward the target's,
gives the G-test's power at each trial count. ``tau``: each tau check's |measured - predicted| over its threshold
(must stay below 1) and the negative control's (must stay above 1), at 60/40 and 30/24 calibration/evaluation
prompts. One thread; minutes in all.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

from stats import exact_joint, g_test, power, root_unverified, trials_to_detect  # noqa: E402
from treespec.models.precision import to_precision  # noqa: E402
from treespec.models.tiny import perturbed_copy, tiny_model  # noqa: E402


def quantised() -> None:
    target = tiny_model("llama", vocab=6, hidden=16, layers=1, scale=3, seed=5)
    exact = exact_joint(target, [1, 2, 3], 3, 1.0)
    for noise in (0.6, 1.0, 1.5, 2.0):
        draft = to_precision(perturbed_copy(target, noise, seed=2), "int8")
        print(f"draft noise {noise}: {trials_to_detect(exact, root_unverified(target, draft, [1, 2, 3], 3, 1.0))} "
              "trials for power 0.99")


def cross(runs: int = 6000) -> None:
    import test_cross_tokenizer as T

    target = tiny_model("llama", vocab=6, hidden=16, layers=1, scale=3, seed=5)
    draft = tiny_model("llama", vocab=7, hidden=16, layers=1, scale=3, seed=7)
    T.N = runs
    counts = T.sample_joint(target, lambda: T.ClaimsUniformDraws(T.cross(draft, depth=3, width=2), 6), "uniform-q")
    exact = exact_joint(target, T.PROMPT, 3, 1.0)
    print(f"control over {runs} runs: G-test p = {g_test(counts, exact):.3g}")
    law = {k: v / runs for k, v in counts.items()}
    for shrink in (1.0, 0.75):
        biased = {k: shrink * law.get(k, 0.0) + (1 - shrink) * exact.get(k, 0.0) for k in set(exact) | set(law)}
        print(f"estimate shrunk to {shrink}: power " + ", ".join(
            f"{n}: {power(exact, biased, n):.4f}" for n in (400, 600, 800, 1000, 3000)))


def tau() -> None:
    import test_acceptance as T
    from tree_builders import sequoia
    from treespec.calibrate.acceptance import MeasuredAcceptance

    target = tiny_model("llama", vocab=256, hidden=64, scale=6, seed=0)
    rng = np.random.default_rng(123)
    prompts = [rng.integers(0, 256, 5).tolist() for _ in range(100)]

    def ratio(draft, parts, mode, temperature, n_eval):
        shape = sequoia(MeasuredAcceptance.merge(parts).vector, 16, max_depth=8)
        pred, se_pred = T.predicted(shape, parts)
        got, se_tau, _ = T.measured(target, draft, shape, prompts[60 : 60 + n_eval], mode, temperature)
        return abs(got - pred) / (4 * float(np.hypot(se_tau, se_pred)) + T.TOLERANCE * pred)

    for n_cal, n_eval in ((60, 40), (30, 24)):
        t = time.perf_counter()
        cases = {}
        for case, (noise, temperature, mode) in T.CASES.items():
            draft = perturbed_copy(target, noise)
            parts = T.calibrate(target, draft, prompts[:n_cal], mode=mode, temperature=temperature)
            cases[case] = draft
            print(f"{n_cal}/{n_eval} {case}: {ratio(draft, parts, mode, temperature, n_eval):.2f} of its threshold")
        worse = T.calibrate(target, perturbed_copy(target, 0.5), prompts[:n_cal], mode="topk", temperature=0.0)
        print(f"{n_cal}/{n_eval} negative control: {ratio(cases['greedy-topk'], worse, 'topk', 0.0, n_eval):.2f} of "
              f"its threshold ({time.perf_counter() - t:.0f} s for this size)")


if __name__ == "__main__":
    SIZINGS = {"quantised": quantised, "cross": cross, "tau": tau}
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("sizing", choices=SIZINGS, help="which test's sizing to run (the module doc)")
    torch.set_num_threads(1)
    SIZINGS[ap.parse_args().sizing]()
