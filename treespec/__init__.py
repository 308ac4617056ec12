"""treespec: exact tree-based speculative decoding for HuggingFace causal language models.

Layers, each importing only the ones before it: ``common`` (rules every layer shares), ``core``
(the decoding loop, trees, caches, acceptance, verifiers), ``drafters``, ``models`` (loading,
precision, timing), ``calibrate`` (acceptance, costs, tuning), ``recipes`` (settings -> drafters,
``run``), ``bench`` (comparisons, demo, sweeps) and ``cli``.
"""

from . import _moved
from .calibrate import acceptance, analysis
from .core import verifiers
from .core.drafting import DraftProposals, Drafter
from .core.engine import generate
from .core.sampling import SamplingParams, standardize
from .core.stats import GenerateOutput, Stats
from .drafters.cross_tokenizer import CrossTokenizerDrafter
from .drafters.model import ModelDrafter
from .drafters.ngram import NGramDrafter
from .recipes import Recipe, resolve, run

_moved.install()


def __getattr__(name: str):
    """``treespec.<old module name>`` (e.g. ``treespec.profile``): the moved module, with a DeprecationWarning."""
    if _moved.new_name(name) is None:
        raise AttributeError(f"module 'treespec' has no attribute {name!r}")
    import importlib

    return importlib.import_module(f"treespec.{name}")


__all__ = [
    "acceptance",
    "analysis",
    "verifiers",
    "CrossTokenizerDrafter",
    "DraftProposals",
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
