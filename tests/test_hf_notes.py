"""transformers' notes that say nothing true of what treespec runs are dropped where they arise, and nothing else:
a GGUF load's "weights stay packed" note (``treespec.models.loading``) and the two notes HF's assisted generation
writes about its own call of the assistant (``treespec.bench.baselines.ASSISTED_NOTES``: the demo's HF assisted
method printed them in the middle of its per-prompt lines)."""

from __future__ import annotations

import logging

import pytest
from transformers.utils import logging as hf_logging

from treespec.bench.baselines import ASSISTED_NOTES, hf_generate
from treespec.common.hf_notes import without_hf_notes
from treespec.models.tiny import greedy_reference, perturbed_copy, tiny_model

GENERATION = "transformers.generation.utils"


class Kept(logging.Handler):
    """The messages a logger lets through (its filters run before its handlers)."""

    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.messages: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.messages.append(record.getMessage())


@pytest.fixture
def kept():
    logger = hf_logging.get_logger(GENERATION)
    handler = Kept()
    logger.addHandler(handler)
    hf_logging.get_logger().warning_once.cache_clear()  # a note written once per process: written again here
    yield handler
    logger.removeHandler(handler)


def test_only_the_named_notes_are_dropped_and_only_in_the_block(kept):
    logger = hf_logging.get_logger(GENERATION)
    with without_hf_notes(GENERATION, "stays packed", "twice"):
        logger.warning("the weights stays packed")
        logger.warning("a processor passed twice over")
        logger.warning("something else")
    logger.warning("the weights stays packed")
    assert kept.messages == ["something else", "the weights stays packed"]


def test_hf_assisted_generation_writes_no_note_on_its_own_call_and_its_tokens_stay(kept):
    """HF's assisted generation with a draft, run for exactly its tokens (``min_new_tokens``, as every baseline
    runs), writes both notes from its own call of the assistant; through ``hf_generate`` neither is written, and
    the tokens are the target's greedy ones."""
    target = tiny_model("qwen2", vocab=64, hidden=32, layers=1, scale=6, seed=2)
    draft = perturbed_copy(target, 0.3)
    prompt = [3, 9, 4, 1, 7]
    tokens, _ = hf_generate(target, prompt, 8, assistant_model=draft)
    assert tokens == greedy_reference(target, prompt, 8)
    assert not [m for m in kept.messages if any(note in m for note in ASSISTED_NOTES)], kept.messages
    # the control: the same call with the notes let through writes both (this transformers' wording is still theirs)
    hf_logging.get_logger().warning_once.cache_clear()
    import treespec.bench.baselines as baselines

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(baselines, "ASSISTED_NOTES", ("a phrase no note holds",))
        assert hf_generate(target, prompt, 8, assistant_model=draft)[0] == tokens
    assert all(any(note in m for m in kept.messages) for note in ASSISTED_NOTES), kept.messages
