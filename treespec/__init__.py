"""treespec: exact tree-based speculative decoding for HuggingFace causal language models."""

from . import acceptance, analysis, profile, verifiers
from .drafting import DraftProposals, Drafter
from .engine import GenerateOutput, Stats, generate
from .model_drafter import ModelDrafter
from .ngram import NGramDrafter
from .sampling import SamplingParams, standardize

__all__ = [
    "acceptance",
    "analysis",
    "profile",
    "verifiers",
    "DraftProposals",
    "Drafter",
    "GenerateOutput",
    "ModelDrafter",
    "NGramDrafter",
    "SamplingParams",
    "Stats",
    "generate",
    "standardize",
]

