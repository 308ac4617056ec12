"""treespec: exact tree-based speculative decoding for HuggingFace causal language models.

Layers, each importing only the ones before it: ``common`` (rules every layer shares), ``core``
(the decoding loop, trees, caches, acceptance, verifiers), ``drafters``, ``models`` (loading,
precision, timing), ``recipes`` (settings -> drafters, ``run``), ``calibrate`` (acceptance, costs,
tuning, and the choices a recipe leaves to measurement: ``resolve``), ``bench`` (comparisons, demo,
sweeps) and ``cli``.

The public names below are imported on first use (PEP 562): ``import treespec`` alone loads neither
torch nor transformers, so the ``treespec`` command answers ``--help`` without them.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from .common import lazy

#: each public name -> the module that defines it (a module's own name: the module itself)
_HOMES = {
    "acceptance": ".calibrate.acceptance",
    "analysis": ".calibrate.analysis",
    "verifiers": ".core.verifiers",
    "BatchOutput": ".core.batch",
    "CrossTokenizerDrafter": ".drafters.cross_tokenizer",
    "DraftProposals": ".core.drafting",
    "Drafter": ".core.drafting",
    "Envelope": ".core.buffers",
    "GenerateOutput": ".core.stats",
    "ModelDrafter": ".drafters.model",
    "NGramDrafter": ".drafters.ngram",
    "Recipe": ".recipes",
    "SamplingParams": ".core.sampling",
    "Stats": ".core.stats",
    "generate": ".core.engine",
    "resolve": ".calibrate.choices",
    "resolve_run": ".calibrate.choices",
    "run": ".calibrate.choices",
    "standardize": ".core.sampling",
}

__all__ = sorted(_HOMES)
#: the layers, imported on first use too (``treespec.core.sampling`` after a bare ``import treespec``)
_LAYERS = ("bench", "calibrate", "cli", "common", "core", "drafters", "models", "recipes")
__getattr__, __dir__ = lazy.exports(__name__, {**_HOMES, **{layer: f".{layer}" for layer in _LAYERS}})


if TYPE_CHECKING:  # what a type checker and an IDE see: the same names, imported eagerly (``X as X``: re-exported)
    from .calibrate import acceptance as acceptance, analysis as analysis
    from .calibrate.choices import resolve as resolve, resolve_run as resolve_run, run as run
    from .core import verifiers as verifiers
    from .core.batch import BatchOutput as BatchOutput
    from .core.buffers import Envelope as Envelope
    from .core.drafting import DraftProposals as DraftProposals, Drafter as Drafter
    from .core.engine import generate as generate
    from .core.sampling import SamplingParams as SamplingParams, standardize as standardize
    from .core.stats import GenerateOutput as GenerateOutput, Stats as Stats
    from .drafters.cross_tokenizer import CrossTokenizerDrafter as CrossTokenizerDrafter
    from .drafters.model import ModelDrafter as ModelDrafter
    from .drafters.ngram import NGramDrafter as NGramDrafter
    from .recipes import Recipe as Recipe
