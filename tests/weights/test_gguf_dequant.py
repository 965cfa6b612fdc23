"""Our torch dequantizers are bit-identical to `gguf.quants.dequantize` (the reference)."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from gguf import GGML_QUANT_SIZES, GGMLQuantizationType as T
from gguf import quants

from augury.weights.gguf_dequant import TORCH_TYPES, dequantize
from augury.weights.gguf_reader import open_data, read_header, tensor_bytes

# byte offsets of the float16 scale fields inside one block of each type
_F16_FIELDS = {
    T.Q4_0: (0,), T.Q4_1: (0, 2), T.Q5_0: (0,), T.Q5_1: (0, 2), T.Q8_0: (0,),
    T.Q4_K: (0, 2), T.Q5_K: (0, 2), T.Q6_K: (208,),
}


def _random_blocks(qtype: T, n_blocks: int, rng: np.random.Generator) -> np.ndarray:
    """Random packed blocks with finite float16 scales (random bytes could be NaN/inf)."""
    _, size = GGML_QUANT_SIZES[qtype]
    b = rng.integers(0, 256, size=(n_blocks, size), dtype=np.uint8)
    for off in _F16_FIELDS[qtype]:
        b[:, off : off + 2] = rng.normal(0, 0.05, size=(n_blocks, 1)).astype(np.float16).view(np.uint8)
    return b


@pytest.mark.parametrize("qtype", sorted(_F16_FIELDS, key=lambda t: t.value), ids=lambda t: t.name)
def test_block_types_match_reference(qtype: T) -> None:
    rng = np.random.default_rng(qtype.value)
    block, _ = GGML_QUANT_SIZES[qtype]
    rows, cols = 6, block * 3
    raw = _random_blocks(qtype, rows * 3, rng).reshape(rows, -1)
    ref = quants.dequantize(raw, qtype)
    out = dequantize(raw, qtype, (rows, cols))
    assert out.dtype == torch.float32 and out.shape == (rows, cols)
    assert torch.equal(out, torch.from_numpy(ref))


@pytest.mark.parametrize("qtype", [T.F32, T.F16, T.BF16], ids=lambda t: t.name)
def test_float_types(qtype: T) -> None:
    x = np.random.default_rng(0).normal(size=(4, 8)).astype(np.float32)
    raw = quants.quantize(x, qtype) if qtype != T.F32 else x
    raw = np.ascontiguousarray(raw).view(np.uint8)
    ref = quants.dequantize(raw.reshape(4, -1), qtype)
    assert torch.equal(dequantize(raw, qtype, (4, 8)), torch.from_numpy(np.asarray(ref, dtype=np.float32)))


def test_fallback_type_uses_reference() -> None:
    qtype = T.Q2_K
    assert qtype not in TORCH_TYPES
    block, size = GGML_QUANT_SIZES[qtype]
    raw = np.random.default_rng(1).integers(0, 256, size=(2, size), dtype=np.uint8)
    raw[:, -4:] = np.array([0.01, 0.02], dtype=np.float16).view(np.uint8)
    out = dequantize(raw, qtype, (2, block))
    assert torch.equal(out, torch.from_numpy(quants.dequantize(raw, qtype)))


def _check_file(path) -> set[str]:
    """Every tensor type in the file: up to 3 tensors each against the reference."""
    header = read_header(path)
    mm = open_data(path)
    seen: dict[T, int] = {}
    for info in header.tensors:
        if seen.get(info.qtype, 0) >= 3:
            continue
        seen[info.qtype] = seen.get(info.qtype, 0) + 1
        raw = np.asarray(tensor_bytes(mm, info))
        rows = info.shape[0] if len(info.shape) > 1 else 1
        ref = np.array(quants.dequantize(raw.reshape(rows, -1), info.qtype)).reshape(info.shape)
        assert torch.equal(dequantize(raw, info.qtype, info.shape), torch.from_numpy(ref)), info.name
    return {t.name for t in seen}


@pytest.mark.real
def test_smollm2_types_match_reference(smollm2_gguf) -> None:
    assert _check_file(smollm2_gguf) == {"F32", "Q4_1", "Q8_0"}


@pytest.mark.real
@pytest.mark.slow
def test_gemma3_types_match_reference(gemma3_gguf) -> None:
    assert _check_file(gemma3_gguf) == {"F32", "Q8_0", "Q5_0", "Q4_K", "Q6_K"}
