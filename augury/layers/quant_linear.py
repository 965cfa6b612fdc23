"""Weight-only quantized linear layers: int8 per output channel, int4 group-wise.

Both run torch's packed-weight kernels (CPU: `_weight_int8pack_mm`,
`_weight_int4pack_mm_for_cpu`; CUDA: tinygemm `_weight_int4pack_mm`). Those
kernels are fast only with bfloat16 activations (fp32/fp16 take milliseconds
per call on CPU, tinygemm is bf16-only), so by default activations are cast to
bf16 at the boundary and the output is cast back to the input dtype.

int4 convention (tinygemm): w = (q - 8) * scale + zero, q in [0, 15], one
(scale, zero) per `group_size` columns of a row.
"""

from __future__ import annotations

import functools
import math
import os
from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from augury.cpu_kernels import load

GROUP_SIZES = (32, 64, 128, 256)
_N_ALIGN = 16  # CPU int4 pack wants N % 16 == 0 (tinygemm: 8); one padding for both keeps repacks shape-stable
_INT8_K_ALIGN = 16  # CPU `_weight_int8pack_mm` in bf16 is wrong for K % 16 != 0 and segfaults for K % 8 != 0
# From this many rows on, dequantizing int8 slices and calling the dense matmul (`_dense_chunked`)
# beats the int8 kernel on CPU. Against torch's `_weight_int8pack_mm` parity was at 8-16 rows; augury's
# kernel (`int8_mm`, a GEMV at heart, linear in the rows) against the float32 dense slices on a 2-core
# AVX2 EPYC, SmolLM2's four product shapes: 0.42x the time at 8 rows, 0.66x at 16, 0.87x at 24, parity
# at 32, 1.3-1.6x at 96-128 (docs/benchmarks.md, "Eighteenth session")
INT8_DENSE_MIN_ROWS = 32
# Int4 on CPU: where a dense copy is kept (dense_prefill_pays: AMX, or no SIMD int4 kernel), steps of
# this many rows and more multiply by it instead of the packed kernel
INT4_DENSE_MIN_ROWS = 16
_DENSE_CHUNK_ELEMS = 1 << 20  # dequantize ~2 MB of bf16 weight at a time so it stays in cache
# bumped whenever an Int4Linear packs its weights or scales anew: holders of packed tensors
# (layers/cpu_decode.py's layer stacks) rebuild when it moves
PACK_GENERATION = 0


@functools.lru_cache(maxsize=1)
def cpu_dense_dtype() -> torch.dtype:
    """The dtype of CPU int4 modules' dense copies (prefill): bf16 where the CPU multiplies bf16 in
    hardware (AVX-512 BF16 or AMX; oneDNN's fast path), float32 elsewhere. Without those instructions
    torch's bf16 matmul is a scalar-ish fallback: on a 2-core AVX2-only EPYC, [1024, 576] x [576, 3072]
    took 227 ms in bf16 and 28 ms in float32 (MKL sgemm), and a 32-token SmolLM2 prompt 450 ms.
    Decided from the instruction set, never from a timing, so a machine always gets the same numbers."""
    bf16_hw = torch.cpu._is_avx512_bf16_supported() or torch.cpu._is_amx_tile_supported()
    return torch.bfloat16 if bf16_hw else torch.float32


def dense_prefill_pays() -> bool:
    """Whether a CPU int4 model keeps dense copies for prefill-sized inputs (`keep_dense_copies`):
    only where the CPU has AMX tiles (oneDNN's bf16 matmul on them is a different class of speed;
    not measured here), or augury's int4 kernel has no SIMD path. Measured against the copy, a
    SmolLM2 layer's four products:
    - 2-core AVX2-only EPYC, int4_mm's AVX2 path against MKL float32: 5.3x faster at 16 rows, 2.9x
      at 64, 1.6x at 512;
    - 2-core Zen 4 EPYC (AVX-512 VNNI and BF16, no AMX), int4_mm's VNNI path against oneDNN bf16:
      2.1x at 16 rows, 1.45x at 64, 1.2x at 256-512 (docs/benchmarks.md, thirtieth session).
    Without the copy every row of every step takes the same kernel, so prefill rows get decode's
    bits, steps of 16+ rows (B=16 decode) take the native layer stack, and the copy's 2-4 bytes a
    weight (212-540 MB for SmolLM2) are not spent. Decided from the instruction set."""
    isa = torch.ops.augury_cpu.int4_isa() if load() else None
    return dense_copy_rule(torch.cpu._is_amx_tile_supported(), isa)


def dense_copy_rule(amx: bool, int4_isa: str | None) -> bool:
    """`dense_prefill_pays` from the facts it reads (int4_isa None: augury's kernels not built)."""
    return amx or int4_isa in (None, "portable")


def _round_up(n: int, m: int) -> int:
    return (n + m - 1) // m * m


# ---------------------------------------------------------------------------- quantization math (pure)


def quantize_int8(w: torch.Tensor, param_dtype: torch.dtype = torch.bfloat16) -> tuple[torch.Tensor, torch.Tensor]:
    """w [N, K] float -> (q [N, K] int8 in [-127, 127], scale [N] float32).

    Symmetric per output channel. The scale is rounded to `param_dtype` before q
    is chosen, so q * scale is exactly what a kernel with that scale dtype computes.
    """
    w = w.detach().float()
    amax = w.abs().amax(dim=1).clamp_min(1e-12)
    scale = (amax / 127.0).to(param_dtype).float()
    q = torch.round(w / scale[:, None]).clamp_(-127, 127).to(torch.int8)
    return q, scale


def quantize_int4(
    w: torch.Tensor, group_size: int = 32, param_dtype: torch.dtype = torch.bfloat16
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """w [N, K] float -> (q [N, K] uint8 in [0, 15], scale [N, G], zero [N, G] float32), G = ceil(K / group_size).

    Asymmetric min/max per group in the tinygemm convention; a last partial
    group takes its range from its real columns only. scale/zero are rounded to
    `param_dtype` first so the kernel reproduces `dequantize_int4` exactly.
    """
    n, k = w.shape
    w = w.detach().float()
    pad = _round_up(k, group_size) - k
    lo = F.pad(w, (0, pad), value=math.inf).view(n, -1, group_size).amin(-1)
    hi = F.pad(w, (0, pad), value=-math.inf).view(n, -1, group_size).amax(-1)
    scale = ((hi - lo) / 15.0).clamp_min(1e-12).to(param_dtype).float()
    zero = (lo + 8.0 * scale).to(param_dtype).float()
    s_full = scale.repeat_interleave(group_size, dim=1)[:, :k]
    z_full = zero.repeat_interleave(group_size, dim=1)[:, :k]
    q = torch.round((w - z_full) / s_full + 8.0).clamp_(0, 15).to(torch.uint8)
    return q, scale, zero


def dequantize_int4(q: torch.Tensor, scale: torch.Tensor, zero: torch.Tensor, group_size: int) -> torch.Tensor:
    """q [N, K] (0..15), scale/zero [N, G] -> w [N, K] float32."""
    k = q.shape[1]
    s = scale.float().repeat_interleave(group_size, dim=1)[:, :k]
    z = zero.float().repeat_interleave(group_size, dim=1)[:, :k]
    return (q.float() - 8.0) * s + z


# ---------------------------------------------------------------------------- int4 packing per device


def _inner_k_tiles(k_padded: int) -> int:
    # tinygemm: K % (16 * innerKTiles) == 0; more tiles per load is faster
    for t in (8, 4, 2):
        if k_padded % (16 * t) == 0:
            return t
    raise ValueError(f"int4 CUDA kernel needs in_features padded to a multiple of 32, got {k_padded}")


def _pack_fn(layout: str, inner_k_tiles: int) -> Callable[[torch.Tensor], torch.Tensor]:
    """q [N, K] int32 (0..15) on the layout's device -> that kernel's packed weight."""
    if layout == "cpu-native":  # augury's own kernel (augury/cpu_kernels/int4_gemm.cpp)
        from augury.cpu_kernels.int4 import pack_nibbles
        return pack_nibbles
    if layout == "cpu":
        return lambda q: torch.ops.aten._convert_weight_to_int4pack_for_cpu(q.contiguous(), inner_k_tiles)
    if layout == "cuda":
        # tinygemm's converter takes two nibbles per byte, even column in the high nibble
        return lambda q: torch.ops.aten._convert_weight_to_int4pack(
            ((q[:, ::2] << 4) | q[:, 1::2]).to(torch.uint8).contiguous(), inner_k_tiles
        )
    raise ValueError(f"no int4 kernel for device type {layout!r} (have: cpu, cuda)")


def _nibbles(packed: torch.Tensor) -> torch.Tensor:
    """Any packed tensor -> its 4-bit values in memory order, uint8 [2 * nbytes] (low nibble first)."""
    b = packed.contiguous().view(torch.uint8).flatten()
    return torch.stack((b & 15, b >> 4), dim=-1).flatten()


def _nibble_sources(pack: Callable[[torch.Tensor], torch.Tensor], n: int, k: int, device: torch.device) -> torch.Tensor:
    """For each nibble of pack(q) in memory order, the row-major index into q [n, k] it came from.

    Found by packing the base-16 digits of the index itself, so it holds for any
    layout that only moves nibbles (both kernels' layouts do; the CPU one depends
    on the machine's SIMD width, so it is never hard-coded here).
    """
    if n * k >= 2**31:
        raise ValueError(f"int4 weight of {n}x{k} is too large to unpack")
    idx = torch.arange(n * k, dtype=torch.int32, device=device)
    src = torch.zeros(n * k, dtype=torch.int32)
    for j in range(max(1, math.ceil(math.log2(max(n * k, 2)) / 4))):
        digit = ((idx >> (4 * j)) & 15).view(n, k)
        src |= _nibbles(pack(digit)).cpu().to(torch.int32) << (4 * j)
    return src.long()


def unpack_int4(packed: torch.Tensor, layout: str, inner_k_tiles: int, n: int, k: int) -> torch.Tensor:
    """Kernel-packed weight -> q [n, k] uint8 on CPU (reference / repacking path, not for the hot loop)."""
    if layout == "cuda":  # tinygemm's layout is written out (and checked against torch's converter)
        from augury.layers import int4_layout

        return int4_layout.unpack(packed.cpu())[:n, :k]
    src = _nibble_sources(_pack_fn(layout, inner_k_tiles), n, k, torch.device("cpu"))
    q = torch.empty(n * k, dtype=torch.uint8)
    q[src] = _nibbles(packed.cpu())
    return q.view(n, k)


@functools.cache
def _use_int8_kernel(device_type: str, dtype: torch.dtype) -> bool:
    """Whether to run `_weight_int8pack_mm` on this device type.

    CUDA has one in torch 2.11 but it measured 3-10x slower than casting the
    weight to bf16 and calling cuBLAS (H200, Llama-8B and SmolLM2 shapes), so
    CUDA takes the fallback; other non-CPU devices (MPS) are probed once.
    """
    if device_type == "cpu":
        return True
    if device_type == "cuda":
        return False
    try:
        g = torch.Generator().manual_seed(0)
        x = torch.randn(2, 32, generator=g).to(device_type, dtype)
        q = torch.randint(-127, 128, (16, 32), generator=g, dtype=torch.int8).to(device_type)
        s = torch.rand(16, generator=g).to(device_type, dtype)
        y = torch.ops.aten._weight_int8pack_mm(x, q, s).float()
        ref = x.float() @ (q.float() * s.float()[:, None]).T
        return bool(torch.allclose(y, ref, rtol=2e-2, atol=2e-1))
    except (RuntimeError, NotImplementedError):
        return False


# AUGURY_INT4_GEMV=1: one-row CUDA products of int4 weights run augury's split-K Triton GEMV on
# tinygemm's packed bytes (`layers/triton_gemv_w4.py`), and the fused decode layer takes int4
# projections. Measured on the H200 (8B, B=1, --compile, one machine start): 338.5 tok/s against
# tinygemm's 284.1, +19% (docs/benchmarks.md, tenth session). Off by default: the GEMV reads a
# transposed copy of the scales (`gemv_scales`, +25% of the packed nibbles, +0.94 GB on the 8B,
# built only when this is on); reading tinygemm's pairs in place measured slower on the large
# products.
_INT4_GEMV_ON = os.environ.get("AUGURY_INT4_GEMV", "0") == "1"
# which bytes that GEMV reads: its own copy (`triton_gemv_w4r`, the default since the twenty-first session:
# 8B B=1 on the H200 387.1 against 362.8 tok/s once its products launch their successors late;
# docs/benchmarks.md) or, with AUGURY_INT4_GEMV_LAYOUT=tinygemm, tinygemm's bytes in place
# (`triton_gemv_w4`: no second copy of the nibbles, +100% of them with the row layout)
# ... or the tensor-core GEMV's copy (`triton_gemv_w4m`, AUGURY_INT4_GEMV_LAYOUT=mma, the default since the
# twenty-second session: the products on mma.sync, 8B B=1 on the H200 448.5 against 387.0 tok/s; shapes of
# 16-row tiles and 256-column blocks at group 32, others take the row layout)
_INT4_GEMV_LAYOUT = os.environ.get("AUGURY_INT4_GEMV_LAYOUT", "mma")
if _INT4_GEMV_LAYOUT not in ("rows", "tinygemm", "mma"):
    raise ValueError(f"AUGURY_INT4_GEMV_LAYOUT={_INT4_GEMV_LAYOUT!r}: use rows (the GEMV's own copy), mma (the "
                     "tensor-core GEMV's copy) or tinygemm (tinygemm's bytes in place, no second copy)")


@functools.lru_cache(maxsize=1)
def gemv_kernels_ok() -> bool:
    """Whether the Triton GEMV (`layers/triton_gemv.py`) imports here. Without triton, tinygemm serves
    every int4 row count and the fused decode layer stays off."""
    try:
        import augury.layers.triton_gemv  # noqa: F401
    except Exception:
        return False
    return True


def _native_int4(act_dtype: torch.dtype, group_size: int) -> bool:
    """Whether a CPU Int4Linear runs augury's own kernel (augury/cpu_kernels/int4_gemm.cpp).

    Its scales are bf16, so only bf16 act_dtype (the default; the scales are stored rounded to it)
    runs there: then the kernel multiplies by exactly the weight `dequantize()` returns. Its
    activations are int8 per 32 columns (as llama.cpp's Q8 activations), where torch's kernel takes
    bf16 ones. `AUGURY_CPU_KERNELS=0`, or no compiler to build it with, keeps torch's kernel."""
    if act_dtype != torch.bfloat16 or group_size % 32:
        return False
    return load()


def _native_int8() -> bool:
    """Whether a CPU Int8Linear's few-row steps run augury's own kernel (augury/cpu_kernels/int8_gemm.cpp):
    on a 2-core AVX2 EPYC torch's `_weight_int8pack_mm` read SmolLM2's weights at ~6 GB/s in decode.
    `AUGURY_CPU_KERNELS=0`, or no compiler to build it with, keeps torch's kernel."""
    return load()


# ---------------------------------------------------------------------------- modules


@dataclass(frozen=True)
class Int4Parts:
    """Unpacked int4 weights (rows can be concatenated/permuted before packing, e.g. fused qkv)."""

    q: torch.Tensor  # [N, K] uint8, 0..15
    scale: torch.Tensor  # [N, G] float32
    zero: torch.Tensor  # [N, G] float32, tinygemm convention (value at q = 8)
    group_size: int

    @staticmethod
    def cat(parts: list[Int4Parts]) -> Int4Parts:
        """Stack along the output dimension (q, k, v -> qkv)."""
        gs = {p.group_size for p in parts}
        if len(gs) != 1:
            raise ValueError(f"cannot fuse int4 parts with different group sizes {sorted(gs)}")
        return Int4Parts(
            torch.cat([p.q for p in parts]),
            torch.cat([p.scale for p in parts]),
            torch.cat([p.zero for p in parts]),
            gs.pop(),
        )

    def rows(self, index: torch.Tensor) -> Int4Parts:
        """index [N'] -> the selected output rows (e.g. a rope permutation)."""
        return Int4Parts(self.q[index], self.scale[index], self.zero[index], self.group_size)

    def dequantize(self) -> torch.Tensor:
        return dequantize_int4(self.q, self.scale, self.zero, self.group_size)


def _check_act_dtype(act_dtype: torch.dtype) -> None:
    if act_dtype not in (torch.bfloat16, torch.float16, torch.float32):
        raise ValueError(f"act_dtype must be bfloat16, float16 or float32, got {act_dtype}")


def _bias_buffer(linear: nn.Linear) -> torch.Tensor | None:
    return None if linear.bias is None else linear.bias.detach().clone()


class Int8Linear(nn.Module):
    """y = x @ (q * scale[:, None]).T + bias with q int8 [N, K], one scale per output channel."""

    def __init__(
        self,
        in_features: int,
        out_features: int,
        bias: bool = False,
        act_dtype: torch.dtype = torch.bfloat16,
        device: torch.device | str | None = None,
    ) -> None:
        super().__init__()
        _check_act_dtype(act_dtype)
        self.in_features, self.out_features, self.act_dtype = in_features, out_features, act_dtype
        self.dense_min_rows = INT8_DENSE_MIN_ROWS
        self._k_pad = _round_up(in_features, _INT8_K_ALIGN) - in_features
        k = in_features + self._k_pad
        self.register_buffer("qweight", torch.zeros(out_features, k, dtype=torch.int8, device=device))
        self.register_buffer("scales", torch.ones(out_features, dtype=act_dtype, device=device))
        self.register_buffer("bias", torch.zeros(out_features, device=device) if bias else None)

    @classmethod
    def from_linear(cls, linear: nn.Linear, act_dtype: torch.dtype = torch.bfloat16) -> Int8Linear:
        """Quantize a copy of `linear.weight` (the source, maybe tied to an embedding, is not touched)."""
        w = linear.weight
        q, scale = quantize_int8(w, act_dtype)
        return cls.from_quantized(q, scale, _bias_buffer(linear), act_dtype, w.device)

    @classmethod
    def from_quantized(
        cls,
        q: torch.Tensor,
        scale: torch.Tensor,
        bias: torch.Tensor | None = None,
        act_dtype: torch.dtype = torch.bfloat16,
        device: torch.device | str | None = None,
    ) -> Int8Linear:
        """q [N, K] int8, scale [N], bias [N] | None."""
        n, k = q.shape
        device = device or q.device
        m = cls(k, n, bias is not None, act_dtype, device)
        with torch.no_grad():
            m.qweight[:, :k].copy_(q)
            m.scales.copy_(scale)
            if bias is not None:
                m.bias = bias.detach().to(device).clone()
        return m

    def dequantize(self) -> torch.Tensor:
        """The weight the kernel multiplies by, float32 [N, K]."""
        return self.qweight[:, : self.in_features].float() * self.scales.float()[:, None]

    def _dense_chunked(self, x2: torch.Tensor) -> torch.Tensor:
        """x2 [M, Kp] -> [M, N] in x2's dtype via dense slices of the weight (many rows: compute-bound, not
        load-bound), multiplied in `cpu_dense_dtype()`: float32 where the CPU has no bf16 matmul
        instructions (there torch's bf16 matmul is ~8x slower than MKL's float32: a 1k-token SmolLM2
        int8 prefill went 60 -> 218 tok/s on a 2-core AVX2 EPYC), the result rounded to x2's dtype."""
        n = self.out_features
        dt = cpu_dense_dtype()
        xd, scales = x2.to(dt), self.scales.to(dt)
        step = max(16, _DENSE_CHUNK_ELEMS // self.qweight.shape[1])
        if step >= n:
            return (F.linear(xd, self.qweight.to(dt)) * scales).to(x2.dtype)
        y = torch.empty(x2.shape[0], n, dtype=dt, device=x2.device)
        for a in range(0, n, step):
            b = min(a + step, n)
            torch.mul(F.linear(xd, self.qweight[a:b].to(dt)), scales[a:b], out=y[:, a:b])
        return y.to(x2.dtype)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """x [..., in] -> [..., out] in x's dtype."""
        lead = x.shape[:-1]
        x2 = x.reshape(-1, self.in_features).to(self.act_dtype)
        if self._k_pad:
            x2 = F.pad(x2, (0, self._k_pad))
        x2 = x2.contiguous()
        if x2.device.type == "cpu" and x2.shape[0] >= self.dense_min_rows:
            y = self._dense_chunked(x2)
        elif x2.device.type == "cpu" and _native_int8():
            # augury's kernel (cpu_kernels/int8_gemm.cpp): float32 sums of exact products, rounded to the
            # activation dtype as torch's kernel rounds its output
            y = torch.ops.augury_cpu.int8_mm(x2.float(), self.qweight, self.scales).to(x2.dtype)
        elif _use_int8_kernel(x2.device.type, x2.dtype):
            y = torch.ops.aten._weight_int8pack_mm(x2, self.qweight, self.scales)
        else:  # per-channel scale commutes with the matmul
            y = F.linear(x2, self.qweight.to(x2.dtype)) * self.scales
        y = y.to(x.dtype)
        if self.bias is not None:
            y = y + self.bias.to(x.dtype)
        return y.view(*lead, self.out_features)

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, act_dtype={self.act_dtype}"


class Int4Linear(nn.Module):
    """y = x @ W.T + bias, W = (q - 8) * scale + zero per group of `group_size` input columns."""

    def __init__(
        self,
        in_features: int,
        out_features: int,
        group_size: int = 32,
        bias: bool = False,
        act_dtype: torch.dtype = torch.bfloat16,
        device: torch.device | str | None = None,
    ) -> None:
        super().__init__()
        if group_size not in GROUP_SIZES:
            raise ValueError(f"int4 group_size must be one of {GROUP_SIZES}, got {group_size}")
        _check_act_dtype(act_dtype)
        device = torch.device(device) if device is not None else torch.device("cpu")
        if device.type == "cuda" and act_dtype != torch.bfloat16:
            raise ValueError("int4 on CUDA runs tinygemm, which takes bfloat16 activations only")
        self.in_features, self.out_features = in_features, out_features
        self.group_size, self.act_dtype = group_size, act_dtype
        # pad K to whole groups and N to the packers' row tile; padded x columns are zero
        self._k_padded = _round_up(in_features, group_size)
        self._n_padded = _round_up(out_features, _N_ALIGN)
        self._inner_k_tiles = _inner_k_tiles(self._k_padded)
        self._layout = device.type
        # augury's own CPU kernel (int8 activations, bf16 scales: the act_dtype the scales are stored in)
        self._native = False
        # derived from scales_zeros (not saved): a buffer, so `.to()` moves it and torch.compile treats
        # it as the module's state like `packed`
        self.register_buffer("native_scales", None, persistent=False)
        # CUDA with AUGURY_INT4_GEMV=1: the (scale, zero) pairs again as int32 for the one-row GEMV (+25% of
        # the packed nibbles), and unless AUGURY_INT4_GEMV_LAYOUT=tinygemm also the GEMV's own copy of the
        # nibbles (+100% more: tinygemm keeps its copy for many rows): the tensor-core GEMV's tiles
        # (`triton_gemv_w4m.pack`, the default) or, where they do not fit or with =rows, the row layout
        # (`triton_gemv_w4r.pack`: row-major in the order its fp16x2 decode wants, tile-major on 8B-sized
        # shapes), the scales in the same order. Derived from packed / scales_zeros, not saved
        self.register_buffer("gemv_packed", None, persistent=False)
        self.register_buffer("gemv_scales", None, persistent=False)
        # no K/N padding and no bias: forward of a 2-D input is cast, one kernel call, cast back
        self._plain = self._k_padded == in_features and self._n_padded == out_features and not bias
        # optional resident bf16 copy [N, K] for many-row inputs (CPU prefill); see keep_dense_copy
        self.dense_weight: torch.Tensor | None = None
        self.dense_min_rows = INT4_DENSE_MIN_ROWS
        self.register_buffer("packed", None)
        self.register_buffer(
            "scales_zeros", torch.zeros(self._k_padded // group_size, self._n_padded, 2, dtype=act_dtype, device=device)
        )
        self.register_buffer("bias", torch.zeros(out_features, device=device) if bias else None)
        self._set_q(torch.full((out_features, in_features), 8, dtype=torch.uint8, device=device))

    @classmethod
    def from_linear(
        cls, linear: nn.Linear, group_size: int = 32, act_dtype: torch.dtype = torch.bfloat16
    ) -> Int4Linear:
        """Quantize a copy of `linear.weight` (the source, maybe tied to an embedding, is not touched)."""
        w = linear.weight
        q, scale, zero = quantize_int4(w, group_size, act_dtype)
        return cls.from_parts(Int4Parts(q, scale, zero, group_size), _bias_buffer(linear), act_dtype, w.device)

    @classmethod
    def from_parts(
        cls,
        parts: Int4Parts,
        bias: torch.Tensor | None = None,
        act_dtype: torch.dtype = torch.bfloat16,
        device: torch.device | str | None = None,
    ) -> Int4Linear:
        """Already-quantized weights (e.g. decoded GGUF Q4_1 blocks). scale/zero are cast to act_dtype."""
        n, k = parts.q.shape
        device = device or parts.q.device
        m = cls(k, n, parts.group_size, bias is not None, act_dtype, device)
        g = parts.scale.shape[1]
        with torch.no_grad():
            m.scales_zeros[:g, :n, 0].copy_(parts.scale.T)
            m.scales_zeros[:g, :n, 1].copy_(parts.zero.T)
            m.scales_zeros[:g, n:, 0] = 1.0  # padded rows: q = 8 -> weight 0
        m._set_q(parts.q.to(m.scales_zeros.device))
        if bias is not None:
            m.bias = bias.detach().to(m.scales_zeros.device).clone()
        return m

    @property
    def _pack_key(self) -> str:
        return "cpu-native" if self._native else self._layout

    def _set_q(self, q: torch.Tensor) -> None:
        """q [N, K] (0..15) -> padded, packed for this module's current layout."""
        qp = torch.full((self._n_padded, self._k_padded), 8, dtype=torch.int32, device=q.device)
        qp[: q.shape[0], : q.shape[1]] = q.to(torch.int32)
        self._native = self._layout == "cpu" and _native_int4(self.act_dtype, self.group_size)
        self.packed = _pack_fn(self._pack_key, self._inner_k_tiles)(qp)
        self._pack_native_scales()

    def _load_from_state_dict(self, *args, **kwargs) -> None:
        super()._load_from_state_dict(*args, **kwargs)
        self._pack_native_scales()  # derived from scales_zeros, which the state dict just replaced

    def _pack_native_scales(self) -> None:
        global PACK_GENERATION
        PACK_GENERATION += 1  # every pack ends here (_set_q, a state-dict load)
        if self._layout == "cuda" and _INT4_GEMV_ON:
            from augury.layers import int4_layout, triton_gemv_w4m, triton_gemv_w4r

            szt = int4_layout.transpose_scales(self.scales_zeros)
            if _INT4_GEMV_LAYOUT == "tinygemm":
                self.gemv_packed, self.gemv_scales = None, szt
            elif _INT4_GEMV_LAYOUT == "mma" and triton_gemv_w4m.supported(self._n_padded, self._k_padded,
                                                                         self.group_size):
                self.gemv_packed, self.gemv_scales = triton_gemv_w4m.pack_from_tinygemm(self.packed, szt)
            else:  # rows, or a shape the mma layout does not hold
                self.gemv_packed, self.gemv_scales = triton_gemv_w4r.pack_from_tinygemm(self.packed, szt,
                                                                                        self.group_size)
        else:
            self.gemv_packed = self.gemv_scales = None
        if self._native:
            from augury.cpu_kernels.int4 import pack_scales

            sz = self.scales_zeros.float()  # [G, Np, 2]
            self.native_scales = pack_scales(sz[..., 0].T, sz[..., 1].T)
        else:
            self.native_scales = None

    def unpack(self) -> torch.Tensor:
        """q [N, K] uint8 on CPU."""
        q = unpack_int4(self.packed, self._pack_key, self._inner_k_tiles, self._n_padded, self._k_padded)
        return q[: self.out_features, : self.in_features]

    def parts(self) -> Int4Parts:
        """Unpacked weights in fp32 scale/zero (for caching converted weights or moving between layouts)."""
        n, g = self.out_features, math.ceil(self.in_features / self.group_size)
        sz = self.scales_zeros[:g, :n].float().cpu()
        return Int4Parts(self.unpack(), sz[..., 0].T.contiguous(), sz[..., 1].T.contiguous(), self.group_size)

    def dequantize(self) -> torch.Tensor:
        """The weight the kernel multiplies by, float32 [N, K] (on CPU)."""
        return self.parts().dequantize()

    def keep_dense_copy(self, dtype: torch.dtype | None = None) -> None:
        """Keep the dequantized weight in `dtype` (default `cpu_dense_dtype()`) for inputs of
        >= dense_min_rows rows (CPU only); those rows are multiplied in that dtype.

        Costs 2 (bf16) or 4 (float32) bytes per weight on top of the packed 0.5. Many-row steps
        differ from the kernel (int8 activations) by rounding; a float32 copy holds the weight the
        kernel uses exactly, a bf16 one rounds it."""
        if self._layout != "cpu":
            raise ValueError("a dense int4 copy is for the CPU kernel only")
        self.dense_weight = self.dequantize().to(dtype or cpu_dense_dtype()).contiguous()

    def _repack_for(self, device_type: str) -> None:
        # the module was moved (`.to`) since packing: the bytes are in the old device's layout
        q = unpack_int4(self.packed.cpu(), self._pack_key, self._inner_k_tiles, self._n_padded, self._k_padded)
        if device_type == "cuda" and self.act_dtype != torch.bfloat16:
            raise ValueError("int4 on CUDA runs tinygemm, which takes bfloat16 activations only")
        self._layout = device_type
        self._set_q(q.to(self.scales_zeros.device))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """x [..., in] -> [..., out] in x's dtype."""
        if self.packed.device.type != self._layout:
            self._repack_for(self.packed.device.type)
        dw = self.dense_weight
        if dw is not None and x.dim() == 2 and x.shape[0] >= self.dense_min_rows and dw.device == x.device:
            y = F.linear(x.to(dw.dtype), dw).to(x.dtype)
            return y if self.bias is None else y + self.bias.to(x.dtype)
        # augury's CPU kernel takes float32 (it quantizes to int8 inside); torch's take act_dtype
        act = torch.float32 if self._native else self.act_dtype
        if self._plain and x.dim() == 2:
            # hot path (every decode step, 4x per layer): no padding, bias or reshape to pay for
            return self._mm(x.to(act).contiguous()).to(x.dtype)
        lead = x.shape[:-1]
        x2 = x.reshape(-1, self.in_features).to(act)
        if self._k_padded != self.in_features:
            x2 = F.pad(x2, (0, self._k_padded - self.in_features))
        y = self._mm(x2.contiguous())
        if self._n_padded != self.out_features:
            y = y[:, : self.out_features]
        y = y.to(x.dtype)
        if self.bias is not None:
            y = y + self.bias.to(x.dtype)
        return y.reshape(*lead, self.out_features)

    def _gemv_args(self) -> dict:
        # the GEMV's own copy where it was built (the measured path), else tinygemm's bytes with the
        # transposed scales, or its pairs, in place (`triton_gemv_w4`)
        if self.gemv_packed is not None:
            return {"w": self.gemv_packed, "scales_zeros": self.gemv_scales, "group_size": self.group_size}
        sz = self.gemv_scales if self.gemv_scales is not None else self.scales_zeros
        return {"w": self.packed, "scales_zeros": sz, "group_size": self.group_size}

    def gemv_weight(self) -> dict | None:
        """The keyword arguments that make `augury.layers.triton_gemv.gemv` multiply by this weight
        (tinygemm's packed bytes, read in place), or None where it cannot: a CPU layout, K or N
        padding or a bias (the fused layer would have to undo them), or `AUGURY_INT4_GEMV=0`."""
        if not (_INT4_GEMV_ON and self._layout == "cuda" and self._plain and self.act_dtype == torch.bfloat16):
            return None
        return self._gemv_args()

    def _mm(self, x2: torch.Tensor) -> torch.Tensor:
        """x2 [M, K padded], contiguous -> [M, N padded] through this module's packed-weight kernel."""
        if x2.shape[0] == 1 and self._layout == "cuda" and _INT4_GEMV_ON and gemv_kernels_ok():
            # one row: a weight stream, where tinygemm (a tensor-core GEMM padding M to 16) spends
            # ~6 instructions per weight; the Triton GEMV reads the same packed bytes
            from augury.layers.triton_gemv import fused_gemv

            return fused_gemv(x2, **self._gemv_args())
        if self._native:
            return torch.ops.augury_cpu.int4_mm(x2, self.packed, self.native_scales, self.group_size)
        if self._layout == "cpu":
            return torch.ops.aten._weight_int4pack_mm_for_cpu(x2, self.packed, self.group_size, self.scales_zeros)
        return torch.ops.aten._weight_int4pack_mm(x2, self.packed, self.group_size, self.scales_zeros)

    def extra_repr(self) -> str:
        return (
            f"in_features={self.in_features}, out_features={self.out_features}, "
            f"group_size={self.group_size}, act_dtype={self.act_dtype}"
        )


DENSE_COPY_BUDGET = 1 << 30  # bytes of dense copies a CPU int4 model may keep for prefill


def keep_dense_copies(model: nn.Module, max_bytes: int = DENSE_COPY_BUDGET, dtype: torch.dtype | None = None) -> int:
    """CPU int4 models small enough: give each Int4Linear but the LM head (one row per request
    at a time) a dense copy (`dtype`, default `cpu_dense_dtype()`) for prefill-sized inputs. All or
    nothing; returns the bytes kept."""
    dtype = dtype or cpu_dense_dtype()
    mods = [m for n, m in model.named_modules()
            if isinstance(m, Int4Linear) and m._layout == "cpu" and n.split(".")[-1] != "lm_head"]
    need = sum(m.out_features * m.in_features * torch.finfo(dtype).bits // 8 for m in mods)
    if not mods or need > max_bytes:
        return 0
    for m in mods:
        m.keep_dense_copy(dtype)
    return need
