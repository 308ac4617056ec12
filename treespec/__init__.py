"""treespec: exact tree-based speculative decoding for HuggingFace causal language models."""

from .drafting import DraftProposals, Drafter
from .engine import GenerateOutput, Stats, generate
from .model_drafter import ModelDrafter
from .sampling import SamplingParams, standardize

__all__ = [
    "DraftProposals",
    "Drafter",
    "GenerateOutput",
    "ModelDrafter",
    "SamplingParams",
    "Stats",
    "generate",
    "standardize",
]

try:  # the n-gram drafter lives in its own module
    from .ngram import NGramDrafter  # noqa: F401

    __all__.append("NGramDrafter")
except ImportError:  # pragma: no cover
    pass
