"""transformers' log notes that say nothing true of what treespec runs, dropped for the block that raises them."""

from __future__ import annotations

import contextlib
import logging
from typing import Iterator


@contextlib.contextmanager
def without_hf_notes(logger_name: str, *phrases: str) -> Iterator[None]:
    """transformers' logger ``logger_name`` drops, for the block, every record whose message holds one of
    ``phrases``; its other records pass as before."""
    from transformers.utils import logging as hf_logging

    logger = hf_logging.get_logger(logger_name)

    def notes(record: logging.LogRecord) -> bool:  # a logger takes a plain function as a filter
        return not any(p in record.getMessage() for p in phrases)

    logger.addFilter(notes)
    try:
        yield
    finally:
        logger.removeFilter(notes)
