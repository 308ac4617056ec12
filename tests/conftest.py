"""Shared test setup: one torch thread; slow real-model checks run only when asked (TREESPEC_SLOW=1 or -m slow).

torch is imported where a fixture needs it: pytest-xdist's controller process loads this file too, and runs no test
(torch's import: 3 CPU seconds beside the workers' collecting)."""

from __future__ import annotations

import contextlib
import functools
import gc
import os
from typing import TYPE_CHECKING

import pytest

if TYPE_CHECKING:
    import torch


@pytest.fixture(scope="session", autouse=True)
def one_thread():
    """Tiny models: threads only add overhead (and the machine's cores are shared); the same for every file."""
    import torch

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def slow_checks_run(config) -> bool:
    """Whether the slow real-model checks run (``TREESPEC_SLOW=1`` or ``-m slow``)."""
    return os.environ.get("TREESPEC_SLOW") == "1" or "slow" in (config.getoption("-m") or "")


@pytest.fixture(scope="session", autouse=True)
def scratch_cache(request, tmp_path_factory):
    """What the tests measure and cache (precision, Linear layout and profile decisions of tiny models loaded from
    files) goes to a scratch cache root, not the user's ``~/.cache/treespec``; the slow real-model checks read the
    user's built models there, and a ``TREESPEC_CACHE`` already set is kept."""
    if slow_checks_run(request.config) or "TREESPEC_CACHE" in os.environ:
        yield
        return
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("TREESPEC_CACHE", str(tmp_path_factory.mktemp("treespec-cache")))
        yield


@pytest.fixture(scope="session", autouse=True)
def shared_runners():
    """Compiled runners shared across tests: a test compiling the step of a (models, shape) another test of this
    worker already ran reuses its graphs (the tiny models' caches are small: keep more runners than a real run)."""
    from treespec.core import captured, compiled

    limits = captured.RUNNERS.limit, compiled.RUNNERS.limit
    captured.RUNNERS.limit = compiled.RUNNERS.limit = 12
    yield
    captured.RUNNERS.limit, compiled.RUNNERS.limit = limits


@pytest.fixture(scope="session", autouse=True)
def model_classes_registered():
    """transformers registers each model class when its first model is built, and a compiled graph guards on how
    many it holds: a class first built mid-run (another family, GPT-2 in an error test) would make every graph
    of this worker compile again. Build one of each class the suite uses, before any test."""
    from transformers import GPT2Config, GPT2LMHeadModel

    from treespec.models.tiny import FAMILIES, tiny_model

    for family in FAMILIES:
        tiny_model(family, layers=1)
    GPT2LMHeadModel(GPT2Config(vocab_size=8, n_embd=8, n_layer=1, n_head=2, n_positions=8))


@functools.lru_cache(maxsize=None)
def tiny_pair(family: str) -> tuple[torch.nn.Module, torch.nn.Module]:
    """A peaky one-layer tiny target of ``family`` and a correlated draft, made once per process: the same
    objects for every test that asks, so the compiled runners (keyed by the models) of one test serve the
    next (pytest makes a parametrized session fixture again each time its parameter comes back)."""
    from treespec.models.tiny import perturbed_copy, tiny_model

    target = tiny_model(family, vocab=64, hidden=64, layers=1, scale=6, seed=0)
    return target, perturbed_copy(target, 0.3)


@pytest.fixture(scope="session", params=["llama", "qwen2"])
def models(request):
    """:func:`tiny_pair` of each family: the compiled-step tests' pair (a test file may define its own ``models``)."""
    return tiny_pair(request.param)


#: the garbage collector's thresholds from the start of a run: its scans run less often (importing torch and
#: transformers, rewriting the test modules' asserts and compiling make many short-lived objects)
GC_THRESHOLDS = (100_000, 50, 50)


def pytest_configure(config):
    """Rarer collections while the tests are collected: with the default thresholds, full scans of the growing heap
    took a quarter of collecting the suite, which every pytest-xdist worker does (``pytest --collect-only``, twice
    each, back to back: 22.3 and 23.5 s -> 17.2 and 17.1 s on the 2-core Zen 3 host)."""
    gc.set_threshold(*GC_THRESHOLDS)


def pytest_collection_finish(session):
    """What is imported by now (torch, transformers, the test modules: millions of objects) lives to the end: out
    of the garbage collector's scans (``gc.freeze``). With :data:`GC_THRESHOLDS`, the collector's time in
    test_captured's compiled and joint tests: 3.7 -> 2.4 s of ~50."""
    gc.collect()
    gc.freeze()


def pytest_collection_modifyitems(config, items):
    if slow_checks_run(config):
        return
    skip = pytest.mark.skip(reason="slow real-model check; set TREESPEC_SLOW=1 (or run `make slow`)")
    for item in items:
        if "slow" in item.keywords:
            item.add_marker(skip)


@contextlib.contextmanager
def counted_forwards(model: torch.nn.Module):
    """A list that grows by one per forward of ``model`` within the block."""
    calls: list[int] = []
    hook = model.register_forward_hook(lambda *_: calls.append(1))
    try:
        yield calls
    finally:
        hook.remove()
