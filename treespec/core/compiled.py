"""The static-shape step behind ``treespec.generate(..., compile=...)``: one compiled target call per step.

Every step has the same tensor shapes and is ONE compiled call (forward, acceptance and commit:
no compiled output ever feeds another compiled graph), so ``torch.compile`` (and CUDA graphs under
``mode="reduce-overhead"``) capture the target's verification forward once and replay it:

* ``StaticTreeCache`` (``treespec.core.static_cache``): a ``transformers`` ``Cache`` whose layers own
  zero-filled ``[1, H, C, D]`` key/value buffers at fixed addresses, ``C`` bucketed from prompt +
  ``max_new_tokens`` + tree width (a multiple of 1024, so prompts and a sweep reuse its graphs). The committed
  length is one device tensor shared by all layers. Step ``t`` writes its tree into slots ``[L, L + W)``; the commit
  gathers the accepted rows into ``[L, L + m)`` with one index tensor for all layers.
* The tree is padded to a fixed width ``W`` (the budget): padding rows attend only to themselves
  and write their own scratch slot of the block. The 4D additive mask ``[1, 1, W, C]`` is built on
  the device from the committed length and the tree's ancestor matrix; positions = ``L + depth``.
* Acceptance runs on the device, by the same functions the eager step calls (``padded.accept``, over
  ``treespec.core.rule``): greedy, the deepest node whose whole path matches the target's argmax;
  sampled, the token-level rule walked proposal by proposal, or traversal verification's leaf tests
  (``verifier="traversal"`` / ``"block"``), on random numbers drawn up front. The accepted path, its
  length and the extra token come back in one small device->host copy, the only sync of a step.
* The prompt is cached through one more compiled graph, for every prompt length
  (``treespec.core.prefill``: exact pieces of a dynamic token count, fixed chunks under CUDA graphs).

Drafters, the trie merge and flattening stay on the host and eager: the loop is ``treespec.core.engine.decode``,
shared with the eager step; this module is only where the forward and the acceptance run.
The stock HF forward is driven with a 4D mask, position ids and the cache; no modelling file is forked.
"""

from __future__ import annotations

import torch

from .compiling import compile_graph, compile_options
from .static_cache import StaticTreeCache
from .padded import Noise, PaddedTree, Proposals, accept, next_pow2, rows_of
from .prefill import padded_length, prefill_for
from .request import Request
from .rule import path_rows
from .runners import RunnerCache, model_key
from .sampling import SamplingParams
from .step import Clock, HostDrafted
from .tree import FlatTree, TokenTree

#: cache rows are allocated in multiples of this: prompts up to ~1k tokens share one set of compiled graphs
#: (a compile costs tens of seconds to minutes on a CPU; attending over masked rows costs little next to the weights)
CAPACITY_BUCKET = 1024
#: on CUDA: attention reads every row of the capacity, and a draft level's 24 attention calls are a fifth of it
#: (cuDNN's kernel for 16 rows: 7.3 us a call over 256 cached rows, 18.1 over 1024 timed alone; 11.2 over 512
#: inside the step, ``experiments/results/gpu-h200-qkv``), against a compile of minutes per capacity
CUDA_CAPACITY_BUCKET = 512


def round_up(n: int, multiple: int) -> int:
    return -(-n // multiple) * multiple


def capacity_for(prompt: int, after: int, device: torch.device | str = "cpu") -> int:
    """Cache rows for a prompt of ``prompt`` tokens and ``after`` more rows (new tokens, a tree), bucketed
    (``CAPACITY_BUCKET``; ``CUDA_CAPACITY_BUCKET`` on CUDA); a chunked prefill's padding included."""
    bucket = CUDA_CAPACITY_BUCKET if torch.device(device).type == "cuda" else CAPACITY_BUCKET
    return round_up(max(prompt + after, padded_length(prompt - 1)), bucket)


class _Runner:
    """One compiled step (target forward, acceptance, commit) for one (model, capacity, width), its
    static cache and its prompt's prefill (``prefill(prompt)``: compiled chunks, ``treespec.core.prefill``).
    A step is ONE compiled call: no output of a compiled graph is ever the input of
    another (under CUDA graphs a second graph's replay may overwrite the first one's outputs), and
    its only output is the small packed path, copied to the host before the next step. ``forward``
    (the verification forward alone) is compiled separately for timing it (``experiments/bench_gpu.py``).
    """

    def __init__(self, model: torch.nn.Module, capacity: int, width: int, backend: str, mode: str | None) -> None:
        self.model, self.width, self.backend = model, width, backend
        self.cache = StaticTreeCache(model, capacity)
        self.prefill = prefill_for(model, self.cache, backend, mode)
        self.params = SamplingParams()
        self.verifier = "rrs"  # the request's rule for sampled steps (set like params; dynamo guards on both)
        self.forward = compile_graph(self.run_eager, backend, mode, (model,))
        self.step = compile_graph(self._step, backend, mode, (model,))

    def run_eager(self, ids: torch.Tensor, depth: torch.Tensor, anc: torch.Tensor) -> torch.Tensor:
        """The target over ``ids`` written at ``[L, L + n)`` (not committed); logits ``[n, V]``."""
        return self.cache.forward(self.model, ids, self.cache.length + depth, anc)

    def _step(self, tree: PaddedTree, props: Proposals | None, noise: Noise | None) -> torch.Tensor:
        """Forward, acceptance (``padded.accept``) and commit: ``[path rows W, m, extra]``."""
        logits = self.run_eager(tree.tokens, tree.depth, tree.anc)
        on_path, extra = accept(logits[None], *rows_of(tree, props, noise), self.params, self.verifier)
        rows, m = path_rows(on_path[0])
        extra = extra[0]
        self.cache.commit(self.cache.length + rows, m)
        return torch.cat([rows, m[None], extra[None]])


#: each holds a full KV cache; a sweep typically needs one per budget
RUNNERS: RunnerCache[_Runner] = RunnerCache(4)


def runner_for(model: torch.nn.Module, capacity: int, width: int, backend: str, mode: str | None) -> _Runner:
    """The (cached) runner for these shapes, or one of a larger capacity (its graphs serve any prompt that fits
    in it: prompts of several lengths after the longest compile nothing); reusing it reuses its compiled graphs
    and cache."""
    base = (model_key(model), width, backend, mode)
    return RUNNERS.get((*base, capacity), lambda: _Runner(model, capacity, width, backend, mode),
                       lambda key, runner: key[:-1] == base and runner.cache.capacity >= capacity)


class CompiledStep(HostDrafted):
    """The engine's step (``treespec.core.engine.Step``) as one compiled target call per step.

    The tree is padded to the request's budget; without one, to the first step's tree size rounded
    up to a power of two, and later trees are merged under that cap (dropping proposals in proposal
    order keeps the output exact). The runner (compiled graphs and static cache) is chosen at the
    first step, so the prefill runs then. Seconds: ``overhead`` is the host's padding, ``verifying``
    the target forward, acceptance and commit up to the step's one device->host copy.
    """

    name = "compiled"

    def __init__(self, req: Request, gen: torch.Generator) -> None:
        self.req, self.gen, self.width = req, gen, req.budget
        self.backend, self.mode = compile_options(req.compile, req.device)
        self.runner: _Runner | None = None

    def prefill(self, prompt: list[int], clock: Clock) -> None:
        """The drafters' pass over the prompt; the target's is deferred to the first :meth:`verify` (the padded
        width, and so the runner, is known then)."""
        self.prefill_drafters(prompt)

    def _start(self, first_tree_size: int, clock: Clock) -> _Runner:
        clock.charge("overhead")
        req = self.req
        width = req.budget or next_pow2(first_tree_size)
        capacity = capacity_for(len(req.prompt), req.max_new_tokens + width, req.device)
        self.runner = runner_for(req.target, capacity, width, self.backend, self.mode)
        self.runner.params, self.runner.verifier, self.width = req.params, req.verifier, width
        self.runner.prefill(req.prompt)
        clock.charge("prefill")
        return self.runner

    def verify(self, tree: TokenTree, flat: FlatTree, clock: Clock) -> tuple[list[int], int]:
        runner = self.runner or self._start(len(flat), clock)
        req, w = self.req, runner.width
        padded = PaddedTree.of(flat, w, req.device)
        props = noise = None
        if not req.params.greedy:
            props = Proposals.of(tree, flat, req.vocab, w, req.device)
            noise = Noise.draw(props.token.shape[0], req.vocab, self.gen, req.device)
        clock.charge("overhead")
        out = runner.step(padded, props, noise).tolist()  # the step's one device->host copy
        clock.charge("verifying")
        m, extra = out[w], out[w + 1]
        return [int(flat.order[i]) for i in out[:m]], extra
