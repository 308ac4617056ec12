"""The device a model runs on: waiting for its queued work."""

from __future__ import annotations

import torch


def sync(device: torch.device | str) -> None:
    """Wait for queued GPU work, so that a wall-clock section measures what it claims (no-op on CPU)."""
    device = torch.device(device)
    if device.type == "cuda":
        torch.cuda.synchronize(device)
