"""treespec: exact tree-based speculative decoding for HuggingFace causal language models."""

from . import acceptance, analysis, profile, verifiers
from .cross_drafter import CrossTokenizerDrafter
from .drafting import DraftProposals, Drafter
from .engine import generate
from .stats import GenerateOutput, Stats
from .model_drafter import ModelDrafter
from .ngram import NGramDrafter
from .sampling import SamplingParams, standardize

__all__ = [
    "acceptance",
    "analysis",
    "profile",
    "verifiers",
    "CrossTokenizerDrafter",
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

