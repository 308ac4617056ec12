"""treespec: exact tree-based speculative decoding for HuggingFace causal language models.

Layers, each importing only the ones before it: ``common`` (rules every layer shares), ``core``
(the decoding loop, trees, caches, acceptance, verifiers), ``drafters``, ``models`` (loading,
precision, timing), ``recipes`` (settings -> drafters, ``run``), ``calibrate`` (acceptance, costs,
tuning, and the choices a recipe leaves to measurement: ``resolve``), ``bench`` (comparisons, demo,
sweeps) and ``cli``.
"""

from .calibrate import acceptance, analysis
from .core import verifiers
from .core.batch import BatchOutput
from .core.buffers import Envelope
from .core.drafting import DraftProposals, Drafter
from .core.engine import generate
from .core.sampling import SamplingParams, standardize
from .core.stats import GenerateOutput, Stats
from .drafters.cross_tokenizer import CrossTokenizerDrafter
from .drafters.model import ModelDrafter
from .drafters.ngram import NGramDrafter
from .calibrate.choices import resolve, run
from .recipes import Recipe

__all__ = [
    "acceptance",
    "analysis",
    "verifiers",
    "BatchOutput",
    "CrossTokenizerDrafter",
    "DraftProposals",
    "Envelope",
    "Drafter",
    "GenerateOutput",
    "ModelDrafter",
    "NGramDrafter",
    "Recipe",
    "SamplingParams",
    "Stats",
    "generate",
    "resolve",
    "run",
    "standardize",
]
