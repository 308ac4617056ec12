"""Targets larger than one device: a model dispatched by accelerate (``device_map``), with weights
offloaded to the CPU and to disk so that its hooks move weights and activations at every layer."""

from pathlib import Path

import pytest
import torch
from accelerate import dispatch_model

import treespec
from treespec.common.device import dispatched, execution_device
from treespec.models import load
from treespec.models.tiny import greedy_reference, perturbed_copy, tiny_model

from test_cli import tiny_dirs  # noqa: F401  (a fixture: tiny local model directories)

PROMPT = [1, 2, 3, 4, 5]
#: the embeddings, the head and every other layer offloaded: the first parameter sits on "meta"
SPLIT = {"model.embed_tokens": "disk", "model.layers.0": "cpu", "model.layers.1": "disk", "model.layers.2": "cpu",
         "model.layers.3": "disk", "model.norm": "cpu", "model.rotary_emb": "cpu", "lm_head": "disk"}


def _dispatched(model: torch.nn.Module, offload: Path) -> torch.nn.Module:
    return dispatch_model(model, device_map=SPLIT, offload_dir=str(offload))


def test_generate_on_a_dispatched_target_equals_the_undispatched_model(tmp_path: Path) -> None:
    target = tiny_model("llama", vocab=64, hidden=64, layers=4, scale=6)
    draft = perturbed_copy(target, 0.3)
    reference = greedy_reference(target, PROMPT, 24)
    spread = _dispatched(target, tmp_path / "target")
    assert dispatched(spread) and next(spread.parameters()).device.type == "meta"
    assert execution_device(spread) == torch.device("cpu")
    shape = [(0,), (1,), (0, 0), (0, 0, 0)]
    for drafters in ([treespec.ModelDrafter(draft, shape)], [treespec.ModelDrafter(spread, shape)],
                     [treespec.NGramDrafter(width=2)]):
        out = treespec.generate(spread, PROMPT, drafters=drafters, max_new_tokens=24)
        assert out.new_tokens == reference, drafters[0].describe()
    assert out.stats.steps < 24 or out.stats.tau >= 1.0
    with pytest.raises(ValueError, match="dispatched over several"):
        treespec.generate(spread, PROMPT, drafters=[], max_new_tokens=4, compile="aot_eager")


def test_load_passes_a_device_map_through(tiny_dirs) -> None:  # noqa: F811
    plain, _ = load(tiny_dirs["target"], dtype="float32")
    split = {"model.embed_tokens": "cpu", "model.layers.0": "disk", "model.layers.1": "cpu", "model.norm": "cpu",
             "model.rotary_emb": "cpu", "lm_head": "disk"}
    mapped, _ = load(tiny_dirs["target"], dtype="float32", device_map=split)
    assert mapped.hf_device_map == split and dispatched(mapped)
    out = treespec.generate(mapped, [1, 2, 3], drafters=[treespec.ModelDrafter(plain, [(0,), (0, 0)])],
                            max_new_tokens=12)
    assert out.new_tokens == greedy_reference(plain, [1, 2, 3], 12)
    with pytest.raises(ValueError, match="device_map needs a floating precision"):
        load(tiny_dirs["draft"], dtype="int8", role="draft", device_map="cpu")
