"""The step clock: on CUDA sections are timed by events (no wait per section), on a CPU by the host's clock."""

from __future__ import annotations

import time

import pytest
import torch

from treespec.core import step as step_module
from treespec.core.stats import Stats
from treespec.core.step import Clock


class FakeEvent:
    """A CUDA event on a fake device timeline: ``at`` milliseconds, ``done`` once the device has reached it."""

    def __init__(self, at: float, done: bool = True) -> None:
        self.at, self.done, self.waited = at, done, False

    def query(self) -> bool:
        return self.done

    def synchronize(self) -> None:
        self.waited, self.done = True, True

    def elapsed_time(self, end: "FakeEvent") -> float:
        assert self.done and end.done, "elapsed_time of an event not yet reached"
        return end.at - self.at


def fake_clock(monkeypatch, events: list[FakeEvent]) -> tuple[Clock, Stats]:
    """A clock on a 'cuda' device whose events are ``events``, in order (the first: the clock's start)."""
    queue = iter(events)
    monkeypatch.setattr(Clock, "_event", staticmethod(lambda device: next(queue)))
    monkeypatch.setattr(step_module, "sync", lambda device: pytest.fail("a CUDA clock waited for the device"))
    stats = Stats()
    return Clock(stats, torch.device("cuda")), stats


def test_cuda_sections_are_event_intervals_added_once_reached(monkeypatch):
    start, drafted, verified, done = FakeEvent(0.0), FakeEvent(3.0), FakeEvent(7.5, done=False), FakeEvent(8.0, False)
    clock, stats = fake_clock(monkeypatch, [start, drafted, verified, done])
    clock.charge("drafting")
    assert stats.drafting_seconds == pytest.approx(3e-3)
    clock.charge("verifying")  # the device has not reached its end: pending, and nobody waits for it
    assert stats.verifying_seconds == 0.0 and not verified.waited
    clock.charge("overhead")
    assert stats.verifying_seconds == 0.0 and stats.overhead_seconds == 0.0
    verified.done = True  # the device got there: the next charge (or settle) adds it without waiting
    clock.settle()
    assert stats.verifying_seconds == pytest.approx(4.5e-3)
    assert stats.overhead_seconds == pytest.approx(0.5e-3) and done.waited  # settle waits for the last one
    assert stats.drafting_seconds + stats.verifying_seconds + stats.overhead_seconds == pytest.approx(8e-3)


def test_waiting_clock_on_cuda_when_events_are_off(monkeypatch):
    waits = []
    monkeypatch.setattr(step_module, "sync", lambda device: waits.append(device))
    monkeypatch.setattr(Clock, "device_events", False)
    monkeypatch.setattr(Clock, "_event", staticmethod(lambda device: pytest.fail("an event with device_events off")))
    stats = Stats()
    clock = Clock(stats, torch.device("cuda"))
    time.sleep(0.01)
    clock.charge("drafting")
    clock.settle()
    assert len(waits) == 1 and stats.drafting_seconds >= 0.01


def test_cpu_clock_reads_the_host_clock():
    stats = Stats()
    clock = Clock(stats, torch.device("cpu"))
    assert not clock.events
    time.sleep(0.01)
    clock.charge("verifying")
    clock.settle()
    assert 0.01 <= stats.verifying_seconds < 1.0


@pytest.mark.parametrize("every", [True, False])
def test_hf_token_clock_stamps_every_token_or_the_prefill_alone(monkeypatch, every):
    """``TokenClock`` in HF ``generate``: a stamp (and a wait for the device) after every new token, or after the
    first alone (the demo's HF baseline: its prefill's end, without holding a GPU's host back at every token)."""
    from treespec.models import timing
    from treespec.models.tiny import tiny_model

    waits = []
    monkeypatch.setattr(timing, "sync", lambda device: waits.append(device))
    model = tiny_model("qwen2", vocab=40, seed=1)
    clock = timing.TokenClock(torch.device("cpu"), every=every)
    with torch.inference_mode():
        model.generate(torch.tensor([[1, 2, 3]]), max_new_tokens=5, min_new_tokens=5, do_sample=False,
                       pad_token_id=0, eos_token_id=None, stopping_criteria=[clock])
    assert len(clock.stamps) == len(waits) == (5 if every else 1)
