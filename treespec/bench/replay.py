"""Same-tree replay of verifiers: compare exact verification rules on identical steps.

Comparing verifiers by running each one live measures prompt noise: after the first tree each rule
follows its own sampled continuation. Here one live run records every sampled step (its token tree,
with the distribution each proposal was drawn from, and the target's logits over it); then every
verifier that is exact for a step's construction walks the *same* tree against the *same* target
distributions. No coin is tossed in the comparison: for each rule and step, every branch of the rule's
accept/reject decisions is walked and weighed by its probability (:func:`expected_accepted`), which
gives the rule's *expected* accepted length on that step exactly (its conditional expectation given the
tree and the targets). The per-step expectations are paired across rules, so the comparison keeps
only the rules' own difference plus the spread over steps; the coin noise that a live comparison, or a
replay with shared seeds, adds on top is gone. (Common random numbers couple poorly here: ``rrs``
decides top-down and ``block`` from the deepest position, so the uniform that decides one rule's length
barely moves the other's; keying uniforms by node was measured to couple them even less.) Exactness of
each rule is unchanged: the replay only measures.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Sequence

import torch

from ..core.constructions import classify
from ..core.engine import EagerStep, decode
from ..core.padded import Noise, PaddedTree, Proposals, accept, rows_of
from ..core.request import Request
from ..core.sampling import SamplingParams
from ..core.stats import GenerateOutput
from ..core.tree import FlatTree, TokenTree
from ..core.verifiers import VERIFIERS, TorchCoins, node_targets
from . import intervals


@dataclass
class RecordedStep:
    """One sampled step: its tree, the target's logits over the flattened tree, and the live walk's random
    numbers (``padded.Noise``; the live walk is reproduced from them)."""

    tree: TokenTree
    flat: FlatTree
    logits: torch.Tensor
    noise: Noise | None
    truncated: bool | None  # whether the budget cut proposals; None when it may have (spectr needs to know)


@dataclass
class Recording:
    """A live run and its recorded steps."""

    output: GenerateOutput
    params: SamplingParams
    steps: list[RecordedStep] = field(default_factory=list)


class _RecordingStep(EagerStep):
    def __init__(self, req: Request, gen: torch.Generator, recording: Recording) -> None:
        super().__init__(req, gen)
        self.recording = recording

    def noise(self, props: int) -> Noise:
        noise = super().noise(props)
        if self.recording.steps and self.recording.steps[-1].noise is None:
            self.recording.steps[-1].noise = noise
        return noise

    def accept(self, tree: TokenTree, flat: FlatTree, logits: torch.Tensor) -> tuple[list[int], int]:
        if tree.size > 1:
            self.recording.steps.append(RecordedStep(tree, flat, logits.detach().clone(), None,
                                                     False if self.req.budget is None else None))
        return super().accept(tree, flat, logits)


def record(target: torch.nn.Module, input_ids: Sequence[int], drafters: Sequence[Any], *, max_new_tokens: int,
           temperature: float, top_k: int = 0, top_p: float = 1.0, seed: int = 0, budget: int | None = None,
           verifier: str = "rrs") -> Recording:
    """Run ``treespec.generate`` (eager, sampled) and record every step that verified a tree."""
    req = Request.checked(target, input_ids, drafters, max_new_tokens, temperature, top_k, top_p, None, seed, budget,
                          None, verifier, False)
    if req.params.greedy:
        raise ValueError("the replay compares sampled verification rules: give temperature > 0 (greedy is one walk)")
    recording = Recording(output=None, params=req.params)  # type: ignore[arg-type]
    recording.output = decode(req, _RecordingStep(req, req.start(), recording))
    return recording


def exact_verifiers(step: RecordedStep) -> list[str]:
    """The verifiers proven exact for ``step``'s construction (``spectr`` only when no budget cut it)."""
    names = []
    for name, spec in VERIFIERS.items():
        if step.truncated is None and name == "spectr":
            continue  # whether the budget cut this tree was not known at recording time
        if spec.exact_for(classify(step.tree, truncated=bool(step.truncated))):
            names.append(name)
    return names


def live(step: RecordedStep, params: SamplingParams, verifier: str) -> int:
    """Accepted drafted tokens of the live run's walk on ``step``, redone with its recorded random numbers."""
    padded = PaddedTree.of(step.flat, len(step.flat), step.logits.device)
    props = Proposals.of(step.tree, step.flat, step.logits.shape[-1], len(step.flat), step.logits.device)
    on_path, _ = accept(step.logits[None], *rows_of(padded, props, step.noise), params, verifier)
    return int(on_path.sum()) - 1


def replay(step: RecordedStep, params: SamplingParams, verifier: str, coins: TorchCoins) -> int:
    """Accepted drafted tokens of ``verifier`` on the recorded ``step`` with ``coins``."""
    path, _ = VERIFIERS[verifier].verify(step.tree, node_targets(step.flat, step.logits, params), coins)
    return len(path) - 1


class _Branch:
    """Coins that follow a fixed prefix of accept/reject answers, then answer "accept", logging each
    decision's probability; ``draw`` (the extra token, which does not change the accepted path) is
    answered without branching."""

    def __init__(self, prefix: tuple[bool, ...]) -> None:
        self.prefix, self.log = prefix, []  # log: (answer, probability of the prefix's answer options)

    def accept(self, prob: float) -> bool:
        prob = min(max(float(prob), 0.0), 1.0)
        i = len(self.log)
        answer = self.prefix[i] if i < len(self.prefix) else prob > 0.0
        self.log.append((answer, prob))
        return answer

    def draw(self, dist: torch.Tensor) -> int:
        return 0


def expected_accepted(step: RecordedStep, params: SamplingParams, verifier: str) -> float:
    """``verifier``'s expected accepted drafted tokens on ``step``, exactly: every branch of its
    accept/reject decisions is walked (a depth-first search over answer prefixes; a branch of
    probability 0 is not explored) and weighed by the product of its answers' probabilities."""
    targets = node_targets(step.flat, step.logits, params)
    cache: dict[int, torch.Tensor] = {}

    def target(v: int) -> torch.Tensor:  # one softmax per node for all branches
        if v not in cache:
            cache[v] = targets(v)
        return cache[v]

    expected, stack = 0.0, [()]
    while stack:
        prefix = stack.pop()
        coins = _Branch(prefix)
        path, _ = VERIFIERS[verifier].verify(step.tree, target, coins)
        weight = 1.0
        for answer, prob in coins.log:
            weight *= prob if answer else 1.0 - prob
        expected += weight * (len(path) - 1)
        for i in range(len(prefix), len(coins.log)):
            answer, prob = coins.log[i]
            if answer and prob < 1.0:  # the other answer to decision i, after the answers taken before it
                stack.append(tuple(a for a, _ in coins.log[:i]) + (False,))
    return expected


def compare(recordings: Sequence[Recording], baseline: str = "rrs") -> dict[str, Any]:
    """Per verifier, over the recorded steps it and ``baseline`` are exact for: the mean expected
    accepted length (drafted tokens per step, :func:`expected_accepted`) and ``tau_ratio``, its expected
    tokens per step (accepted + 1) over the baseline's on the same steps, with a paired bootstrap 95%
    interval over steps."""
    pairs: dict[str, list[tuple[float, float]]] = {}  # verifier -> (its expected accepted, baseline's) per step
    for rec in recordings:
        for step in rec.steps:
            names = exact_verifiers(step)
            if baseline not in names:
                continue
            base = expected_accepted(step, rec.params, baseline)
            for name in names:
                pairs.setdefault(name, []).append(
                    (expected_accepted(step, rec.params, name) if name != baseline else base, base))
    out: dict[str, Any] = {"baseline": baseline, "verifiers": {}}
    for name, both in pairs.items():
        mine, theirs = [a for a, _ in both], [b for _, b in both]
        entry: dict[str, Any] = {"steps": len(both), "mean_accepted": sum(mine) / len(mine)}
        if name != baseline:
            entry["tau_ratio"] = intervals.ratio_of_sums([a + 1 for a in mine], [b + 1 for b in theirs]).as_dict()
        out["verifiers"][name] = entry
    return out
