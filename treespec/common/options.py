"""The names and defaults a run's options choose from, in a module that imports neither torch nor transformers:
the ``treespec`` command's parser reads them here (``treespec generate --help`` answers in a fraction of a second),
and each rule's owner takes its list from here (the verifier registry's names are checked against
:data:`VERIFIER_NAMES` by the tests)."""

from __future__ import annotations

from tree_builders.budgeted import STATIC_BUILDERS

#: tree builders a recipe names: the static ones, and the dynamic EAGLE-2 tree (``treespec.recipes``)
TREES = (*STATIC_BUILDERS, "dynamic")
#: the trees the tuner sizes (``treespec.calibrate.choices``): Sequoia's DP, and the builders of a budget whose nodes
#: are ranked children of one draft model's tree (its top-k or without-replacement draws), which the acceptance rows
#: score. Independent chains (``chains``: sampled with replacement) and the dynamic tree are a pilot's; a static path
#: list runs as given (all its paths, unless a budget cuts them), its depth a pilot's.
TUNED_TREES = ("sequoia", "chain", "kary")
#: how a model drafter picks the children of a static tree (``treespec.drafters.model``)
STATIC_MODES = ("topk", "sample", "sample_without_replacement")
#: the exact verification rules of sampled steps (``treespec.core.verifiers.VERIFIERS``, in this order)
VERIFIER_NAMES = ("rrs", "block", "traversal", "spectr")
#: how an acceptance measurement writes its continuation (``treespec.calibrate.acceptance``'s module doc)
CONTEXTS = ("walk", "target")
#: tree sizes the profile times by default (``treespec.calibrate.tuning``)
PROFILE_SIZES = (1, 2, 4, 8, 12, 16, 24, 32, 48, 64)

#: the precisions a model may run in (``treespec.models.precision``)
PRECISIONS = ("float32", "bfloat16", "float16", "int8", "int4")
#: the floating-point precisions (a target may run in any of them, or in int4 on a GGUF file's own blocks; int8 is for
#: drafts only)
FLOATS = PRECISIONS[:3]
#: the precisions a target may run in (int4: a GGUF file's own 4-bit blocks, CPU only; int8 is for drafts only)
TARGET_PRECISIONS = (*FLOATS, "int4")
#: the names a user may give per role (``auto`` measures; see ``treespec.models.precision.auto_precision``)
CHOICES = {"target": ("auto", *TARGET_PRECISIONS), "draft": ("auto", *PRECISIONS)}

#: the built-in pair, packaged as GGUF files (``treespec.models.packaged``)
DEFAULT_TARGET = "qwen2.5-coder-1.5b-instruct"
DEFAULT_DRAFT = "qwen2.5-coder-0.5b-instruct"
