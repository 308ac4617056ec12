"""Shared test setup: one torch thread; slow real-model checks run only when asked (TREESPEC_SLOW=1 or -m slow)."""

import os

import pytest
import torch


@pytest.fixture(scope="session", autouse=True)
def one_thread():
    """Tiny models: threads only add overhead (and the machine's cores are shared); the same for every file."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture(scope="session", autouse=True)
def shared_runners():
    """Compiled runners shared across tests: a test compiling the step of a (models, shape) another test of this
    worker already ran reuses its graphs (the tiny models' caches are small: keep more runners than a real run)."""
    from treespec.core import captured, compiled

    limits = captured.RUNNERS.limit, compiled.RUNNERS.limit
    captured.RUNNERS.limit = compiled.RUNNERS.limit = 12
    yield
    captured.RUNNERS.limit, compiled.RUNNERS.limit = limits


@pytest.fixture(scope="session", params=["llama", "qwen2"])
def models(request):
    """A peaky tiny target of each family and a correlated draft: the compiled-step tests' pair
    (a test file may define its own ``models``)."""
    from treespec.models.tiny import perturbed_copy, tiny_model

    target = tiny_model(request.param, vocab=64, hidden=64, layers=1, scale=6, seed=0)
    return target, perturbed_copy(target, 0.3)


def pytest_collection_modifyitems(config, items):
    if os.environ.get("TREESPEC_SLOW") == "1" or "slow" in (config.getoption("-m") or ""):
        return
    skip = pytest.mark.skip(reason="slow real-model check; set TREESPEC_SLOW=1 (or run `make slow`)")
    for item in items:
        if "slow" in item.keywords:
            item.add_marker(skip)
