"""The acceptance measurement takes the static drafting modes only: a dynamic tree has no proposal law."""

import pytest

from treespec.calibrate.acceptance import measure
from treespec.drafters.model import MODES, STATIC_MODES
from treespec.models.tiny import perturbed_copy, tiny_model


def test_dynamic_mode_is_refused_not_measured_as_sampling_without_replacement() -> None:
    """``dynamic`` is a ModelDrafter mode, but its children are point masses chosen by confidence, not
    draws: measuring it would silently measure sampling without replacement instead."""
    target = tiny_model("llama", vocab=32, scale=4)
    draft = perturbed_copy(target, 0.3)
    assert "dynamic" in MODES and "dynamic" not in STATIC_MODES
    with pytest.raises(ValueError, match="unknown mode 'dynamic'.*measure it as 'topk'.*topk, sample, "
                                         "sample_without_replacement"):
        measure(target, draft, [[1, 2, 3]], width=2, mode="dynamic", max_new_tokens=4, progress=False)
    acc = measure(target, draft, [[1, 2, 3]], width=2, mode="sample_without_replacement", temperature=1.0,
                  max_new_tokens=4, max_depth=2, progress=False)
    assert acc.meta["mode"] == "sample_without_replacement"
