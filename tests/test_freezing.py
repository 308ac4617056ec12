"""Inductor with weight freezing, the captured step's CPU configuration: freezing folds what a graph only reads
into constants, so every static tensor a call reads (caches, their lengths, the tree buffers) must stay an input
or be mutated by it. Exact (greedy = HF greedy and the eager step) with several runners in one process, a long
prompt's chunk graph, several trees in one envelope, and an int4 draft; and HF's own compiled decoding under it (the
baselines' fastest plain decoding on a CPU).

The tests share one tiny configuration (qwen2, vocab 64, hidden 64, one layer) and the trees of one envelope
(``KARY``'s own), and one worker runs them in order. A frozen graph is never loaded from inductor's graph cache
(freezing packs the weights for oneDNN, which the cache cannot pickle), so each test traces and generates its graphs
anew; only the C++ kernels, cached by their source, are compiled once for all the tests (g++ is most of a frozen
compile here: ~2 s a kernel). Each test makes its own models and runners: what a test checks is its own compile."""

import pytest
import torch
from torch._dynamo.utils import counters

import treespec
from treespec.core import captured, compiled, prefill
from treespec.core.buffers import Envelope
from treespec.models.precision import to_precision
from treespec.models.tiny import greedy_reference, perturbed_copy, tiny_model

pytestmark = pytest.mark.xdist_group("freezing")

KARY = [(0,), (1,), (0, 0), (0, 1), (1, 0), (1, 1)]
ENVELOPE_TREES = [KARY, [(0,), (1,)], [(0,), (0, 0)], [(0,), (1,), (1, 0)]]  # KARY's envelope


def fresh_pair(draft_precision: str = "float32") -> tuple[torch.nn.Module, torch.nn.Module]:
    """New objects (no runner of another test is keyed by them) of the configuration every test here shares."""
    target = tiny_model("qwen2", vocab=64, hidden=64, layers=1, scale=6, seed=0)
    return target, to_precision(perturbed_copy(target, 0.3), draft_precision)


def run(target, draft, prompt, n, shape, mode="topk", **kwargs):
    return treespec.generate(target, prompt, drafters=[treespec.ModelDrafter(draft, shape, mode)], max_new_tokens=n,
                             **kwargs)


def prompt_of(n: int, seed: int = 0) -> list[int]:
    return torch.randint(0, 64, (n,), generator=torch.Generator().manual_seed(seed)).tolist()


@pytest.fixture(autouse=True)
def no_runners_left():
    """Runners compiled under freezing stay in this test."""
    captured.RUNNERS.clear()
    compiled.RUNNERS.clear()
    yield
    captured.RUNNERS.clear()
    compiled.RUNNERS.clear()


@pytest.mark.parametrize("mode", ["topk", "sample"], ids=["captured", "host-drafted"])
def test_freezing_with_several_runners_prompt_lengths_and_trees_in_one_process(mode):
    """Under weight freezing a compiled graph keeps the static tensors it saw (the caches) as its own attributes;
    a runner made later must compile its own graphs rather than pass the first one's guards and use its caches.
    The hardest case: the same models and tree again after the first runner was evicted (every graph the same
    code and shapes as the first runner's). Each runner prefills a prompt in pieces (the chunk graph mutates the
    cache and its length: neither is folded into a constant), then prompts of other lengths, which add no graph.
    The captured step's second runner then runs the other trees of its envelope (smaller ones padded): a static
    tensor that a graph only reads would be folded into a constant, so the tree buffers must stay graph inputs (a
    tree frozen into the graph would replay the first shape); none adds a graph either. Every run's greedy output
    equals HF's and the eager step's, and so does its walk. The captured step's draft is int4
    (``treespec.models.quantized``): its level graph lowers the int4 kernel, frozen; its prompt prefills eagerly on
    its int8 twin (``prefill.prefill_for``), so the chunk graph is the target's alone (the host-drafted step drafts
    eagerly: its draft stays float32)."""
    target, draft = fresh_pair("int4" if mode == "topk" else "float32")
    assert prefill.CHUNKED_MIN <= 18
    env = Envelope.for_shapes(ENVELOPE_TREES)
    assert env == Envelope(7, (2, 2), 2)  # KARY's own
    other_trees = [(tree, 8) for tree in ENVELOPE_TREES[1:]] + [(KARY, 3)] if mode == "topk" else [(KARY, 8)]
    later = {0: [(KARY, 18)], 1: other_trees}  # after each runner's first prompt (which compiles)
    with torch._inductor.config.patch(freezing=True):
        for runner in range(2):
            captured.RUNNERS.clear()  # the first runner evicted: the second is made again
            compiled.RUNNERS.clear()
            for i, (tree, n) in enumerate([(KARY, 24), *later[runner]]):
                prompt = prompt_of(n, seed=n + runner)
                graphs = counters["stats"]["unique_graphs"]
                eager = run(target, draft, prompt, 24, tree, mode, seed=0)
                out = run(target, draft, prompt, 24, tree, mode, seed=0, compile="inductor", envelope=env)
                assert (out.stats.step == "captured") == (mode == "topk")  # sampling with replacement: on the host
                assert out.new_tokens == eager.new_tokens == greedy_reference(target, prompt, 24)
                assert out.stats.step_tokens == eager.stats.step_tokens or mode == "topk"
                assert out.stats.step_tokens[:-1] == eager.stats.step_tokens[: len(out.stats.step_tokens) - 1]
                assert max(out.stats.tree_sizes) == len(tree) + 1 or mode == "sample"  # (draws may repeat)
                assert (counters["stats"]["unique_graphs"] > graphs) == (i == 0)  # its own graphs, then none


def test_hfs_fastest_plain_decoding_under_freezing_is_its_greedy_decoding():
    """The baseline the demo and the benchmarks time as HF's fastest plain decoding on a CPU (``generate`` with a
    static cache and ``torch.compile`` under inductor's weight freezing) gives HF's eager greedy tokens."""
    from treespec.bench import compare

    target, _ = fresh_pair()
    method = compare.hf_compiled_method(target)
    assert method.name == "hf-float32-static-compiled" and method.baseline
    prompt = [5, 6, 7, 8]
    tokens, seconds, _ = method.run(prompt, 12)
    assert tokens == greedy_reference(target, prompt, 12) and seconds > 0


def test_hfs_fastest_settings_freeze_whatever_the_device():
    """HF's fastest plain decoding compiles under inductor's weight freezing on CUDA too (an H200: 247.5 against
    224.1 tok/s without it, gpu-h200-math); it was a CPU's setting alone, and the sweeps' CUDA baseline ran without."""
    import torch

    from treespec.bench.baselines import fastest_compile_settings

    assert not torch._inductor.config.freezing
    with fastest_compile_settings():
        assert torch._inductor.config.freezing
    assert not torch._inductor.config.freezing


def test_compile_graph_freezes_the_weights_it_reads():
    """``compile=True`` on a CPU folds a module's weights into the graph as constants: inductor's generated code
    reads frozen parameters (``torch.compile(options={"freezing": True})`` alone left them graph inputs); another
    backend, or a mode, compiles without freezing."""
    from torch._inductor.utils import run_and_get_code

    from treespec.core.compiling import compile_graph

    layer = torch.nn.Linear(8, 8).eval()
    x = torch.randn(2, 8)
    with torch.inference_mode():
        out, codes = run_and_get_code(compile_graph(lambda v: layer(v).relu(), "inductor", None), x)
        assert torch.allclose(out, layer(x).relu())
        assert "_frozen_param" in "\n".join(codes)
        plain = torch.compile(lambda v: layer(v).relu(), fullgraph=True, options={"freezing": True})
        _, codes = run_and_get_code(plain, x)
        assert "_frozen_param" not in "\n".join(codes)  # the control: options alone freeze nothing
