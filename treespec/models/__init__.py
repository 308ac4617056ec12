"""Loading models (built-in packaged pairs, any HF id or directory), their precision, and timing them."""

from .loading import check_source, check_tokenizers, load
from .packaged import DEFAULT_DRAFT, DEFAULT_TARGET, SMOLLM2, MissingModelPackageError, PackagedModel, cache_root
from .pair import tokenizers_match

__all__ = ["DEFAULT_DRAFT", "DEFAULT_TARGET", "SMOLLM2", "MissingModelPackageError", "PackagedModel", "cache_root",
           "check_source", "check_tokenizers", "load", "tokenizers_match"]
