"""Warming attention's K/V rows into L2 from the kernel before it (batch-1 decode on the GPU).

In a one-token step the qkv product ends, then attention starts its chain of dependent loads:
q, then the gathered K/V tiles, from DRAM. Between qkv's last weight tile and attention's first
K/V load the DRAM has nothing to do for ~2 us (qkv's tail, its epilogue, the launch edge). The
qkv kernel can fill that gap: once its own weight tiles are in, each program asks L2 for a share
of the rows attention will read (`prefetch.global.L2`, sm_80+: one instruction per 128-byte
line, no register or shared memory held, nothing waited for), so attention finds them in L2.

A prefetch is a hint: results never depend on it, only timing does. Under the interpreter, which
runs no inline assembly, the same addresses are loaded plainly (so tests still check that every
address the compiled kernel would prefetch lies inside the pools).

Modes (`WARM`): 0 off, 1 `prefetch.global.L2`, 2 with the `L2::evict_last` priority, 3 the
interpreter's plain loads.
"""

from __future__ import annotations

import os

import torch
import triton
import triton.language as tl

MODES = {"0": 0, "1": 1, "last": 2}
LINE = 128  # bytes per prefetch


def mode_from(value: str | int | None, device: torch.device) -> int:
    """AUGURY_KV_WARM's value (None: unset -> off; or a mode number 0-2) -> the kernel mode for
    `device`: the compiled modes on CUDA, the plain-load stand-in (3) under the interpreter;
    unknown values are refused."""
    if value is None:
        return 0
    m = value if isinstance(value, int) else MODES.get(value)
    if m not in (0, 1, 2):
        raise ValueError(f"AUGURY_KV_WARM={value!r}: use one of {', '.join(MODES)} (unset: 0)")
    if m and (device.type != "cuda" or os.environ.get("TRITON_INTERPRET") == "1"):
        return 3
    return m


def plan(n_slots: int, programs: int, row_elems: int, elem_bytes: int) -> tuple[int, int, int]:
    """(slots per program, lines per pool row, pool elements per line), the first two powers of
    two (the kernel's arange sizes): `programs` programs cover `n_slots` slots, each slot's K row
    and V row of `row_elems` elements in 128-byte lines."""
    per = triton.next_power_of_2(max(1, -(-n_slots // programs)))
    step = LINE // elem_bytes
    return per, triton.next_power_of_2(max(1, -(-row_elems // step))), step


@triton.jit
def warm_addresses(gather_ptr, n_slots, kp_ptr, vp_ptr, s_kslot, s_vslot, row_elems, pid, n_prog,
                   PER: tl.constexpr, LINES: tl.constexpr, STEP: tl.constexpr):
    """Program `pid` of `n_prog`: the [PER * 2 * LINES] line addresses of its slots' K and V rows
    (slot i of the program is gather[pid + i * n_prog]; STEP pool elements per line), and which
    of them are real."""
    e = tl.arange(0, PER * 2 * LINES)
    j = pid + (e // (2 * LINES)) * n_prog
    is_v = (e // LINES) % 2 == 1
    line = e % LINES
    ok = (j < n_slots) & (line * STEP < row_elems)
    slot = tl.load(gather_ptr + j, mask=ok, other=0).to(tl.int64)
    k_addr = kp_ptr + slot * s_kslot + line * STEP
    v_addr = vp_ptr + slot * s_vslot + line * STEP
    return tl.where(is_v, v_addr, k_addr), ok


@triton.jit
def warm(addr, ok, MODE: tl.constexpr):
    """Ask L2 for the lines at `addr` where `ok` (MODE as in the module docstring)."""
    if MODE == 1:
        tl.inline_asm_elementwise(
            "{ .reg .pred p; setp.ne.s32 p, $2, 0; @p prefetch.global.L2 [$1]; mov.u32 $0, 0; }",
            "=r,l,r", [addr.to(tl.int64), ok.to(tl.int32)], dtype=tl.int32, is_pure=False, pack=1)
    elif MODE == 2:
        tl.inline_asm_elementwise(
            "{ .reg .pred p; setp.ne.s32 p, $2, 0; @p prefetch.global.L2::evict_last [$1]; mov.u32 $0, 0; }",
            "=r,l,r", [addr.to(tl.int64), ok.to(tl.int32)], dtype=tl.int32, is_pure=False, pack=1)
    elif MODE == 3:
        tl.load(addr, mask=ok)
