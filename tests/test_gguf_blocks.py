"""A GGUF file's 4-bit blocks mapped onto the int4 kernel as they are (treespec.models.gguf_blocks): a tiny file
written with the ``gguf`` package holding Q4_0, Q4_1, Q4_K and Q8_0 tensors; the mapped weights equal the
package's own dequantisation, the kernel multiplies with them up to its bfloat16 scales, and Q8_0 (no exact map)
is reported as such and kept at the file's precision (bfloat16), not re-quantised to 4 bits."""

import numpy as np
import pytest
import torch

from treespec.models.gguf_blocks import EXACT_INT4, int4_groups
from treespec.models.gguf_blocks import with_file_blocks
from treespec.models.quantized import PROMPT_ROWS, BFloat16Linear, Int4Linear, Int8Linear

gguf = pytest.importorskip("gguf")
ROWS, COLUMNS = 32, 256


def q4k_blocks(rows: int, columns: int, seed: int = 0) -> np.ndarray:
    """Random Q4_K super-blocks (any bytes are a valid block once ``d`` and ``dmin`` are finite): gguf-py
    reads the type but does not write it."""
    rng = np.random.default_rng(seed)
    blocks = rng.integers(0, 256, size=(rows * columns // 256, 144), dtype=np.uint8)
    halves = rng.uniform(0.001, 0.02, size=(blocks.shape[0], 2)).astype(np.float16)
    blocks[:, :4] = halves.view(np.uint8)
    return blocks.reshape(rows, -1)


@pytest.fixture(scope="module")
def reader(tmp_path_factory):
    rng = np.random.default_rng(1)
    w = rng.standard_normal((ROWS, COLUMNS)).astype(np.float32)
    path = tmp_path_factory.mktemp("gguf") / "tiny.gguf"
    writer = gguf.GGUFWriter(str(path), "llama")
    for name, qtype in (("q4_0", gguf.GGMLQuantizationType.Q4_0), ("q4_1", gguf.GGMLQuantizationType.Q4_1),
                        ("q8_0", gguf.GGMLQuantizationType.Q8_0)):
        writer.add_tensor(name, gguf.quants.quantize(w, qtype), raw_dtype=qtype)  # shape: from the bytes
    writer.add_tensor("q4_k", q4k_blocks(ROWS, COLUMNS), raw_dtype=gguf.GGMLQuantizationType.Q4_K)
    for write in (writer.write_header_to_file, writer.write_kv_data_to_file, writer.write_tensors_to_file):
        write()
    writer.close()
    return gguf.GGUFReader(str(path))


def tensors(reader):
    return {t.name: t for t in reader.tensors}


def test_every_4bit_block_maps_onto_the_kernel_s_groups_exactly(reader):
    for name, t in tensors(reader).items():
        expected = gguf.quants.dequantize(t.data, t.tensor_type).reshape(ROWS, COLUMNS)
        groups = int4_groups(t.data, int(t.tensor_type), ROWS, COLUMNS)
        if name == "q8_0":
            assert groups is None and int(t.tensor_type) not in EXACT_INT4  # no exact map: the caller re-quantises
            continue
        codes, scale, zero = groups
        assert codes.dtype == np.uint8 and codes.max() <= 15 and scale.shape == zero.shape == (ROWS, COLUMNS // 32)
        mapped = (codes.reshape(ROWS, -1, 32).astype(np.float32) - 8) * scale[..., None] + zero[..., None]
        # the same weights, up to float32 rounding of (q - 8) s + (8 s + offset) against s q + offset
        np.testing.assert_allclose(mapped.reshape(ROWS, COLUMNS), expected, rtol=0, atol=1e-6 * np.abs(expected).max())
        assert len(np.unique(codes)) == 16  # the file's own codes, all of them used


def test_the_kernel_multiplies_with_the_file_s_weights_up_to_its_bfloat16_scales(reader):
    x = torch.randn(3, COLUMNS, generator=torch.Generator().manual_seed(0))
    for name in ("q4_0", "q4_1", "q4_k"):
        t = tensors(reader)[name]
        codes, scale, zero = int4_groups(t.data, int(t.tensor_type), ROWS, COLUMNS)
        layer = Int4Linear.from_groups(torch.from_numpy(codes), torch.from_numpy(scale), torch.from_numpy(zero))
        as_kept = ((torch.from_numpy(codes).view(ROWS, -1, 32).float() - 8)
                   * torch.from_numpy(scale).bfloat16().float()[..., None]
                   + torch.from_numpy(zero).bfloat16().float()[..., None]).view(ROWS, COLUMNS)
        expected = x.bfloat16().float() @ as_kept.t()
        torch.testing.assert_close(layer(x), expected, rtol=2e-2, atol=2e-2 * expected.abs().max().item())
        # negative control: the file's weights read with the nibbles of each byte swapped are another matrix
        swapped = ((codes & 0x0F) << 4 | codes >> 4) & 0x0F
        other = Int4Linear.from_groups(torch.from_numpy(swapped), torch.from_numpy(scale), torch.from_numpy(zero))
        assert (other(x) - expected).abs().max() > 0.1 * expected.abs().max()


def test_a_row_of_partial_blocks_is_refused():
    with pytest.raises(ValueError, match="whole blocks of 256"):
        int4_groups(np.zeros((16, 144), np.uint8), 12, 16, 128)


def test_a_type_without_an_exact_map_runs_the_file_s_weights_in_int8(reader):
    """A Linear whose tensor has no 4-bit blocks (Q8_0 here; Q6_K in the built-in Q4_K_M files) runs its dequantised
    weights re-quantised to int8 per row (with a bfloat16 twin of those weights for prompts), nearer the file than
    the same weights re-quantised to 4 bits (the control)."""
    t = tensors(reader)["q8_0"]
    w = torch.from_numpy(gguf.quants.dequantize(t.data, t.tensor_type).reshape(ROWS, COLUMNS).copy())
    codes, scale, zero = int4_groups(tensors(reader)["q4_0"].data, int(gguf.GGMLQuantizationType.Q4_0), ROWS, COLUMNS)
    model = torch.nn.Sequential(torch.nn.Linear(COLUMNS, ROWS, bias=False), torch.nn.Linear(COLUMNS, ROWS))
    with torch.no_grad():
        model[1].weight.copy_(w)
    blocks = {"0.weight.codes": torch.from_numpy(codes[:, 0::2] | (codes[:, 1::2] << 4)),
              "0.weight.scale": torch.from_numpy(scale), "0.weight.zero": torch.from_numpy(zero)}
    requantized = Int4Linear.from_linear(model[1], 32, twin=None)
    model, counts = with_file_blocks(model, blocks)
    assert counts == {"exact": 1, "int8": 1}
    assert isinstance(model[0], Int4Linear) and isinstance(model[1], Int8Linear)
    assert isinstance(model[1].wide, BFloat16Linear) and model[1].wide_rows == PROMPT_ROWS
    x = torch.randn(PROMPT_ROWS, COLUMNS, generator=torch.Generator().manual_seed(2))
    expected = x @ w.t() + model[1].bias
    kept, again = (model[1](x[:4]) - expected[:4]).abs().max(), (requantized(x[:4]) - expected[:4]).abs().max()
    assert kept < 0.01 * expected.abs().max() and again > 4 * kept
    twin = (model[1](x) - torch.cat([model[1](row[None]) for row in x])).abs().max()  # a prompt: the twin
    assert twin < 0.01 * expected.abs().max()
