"""Per-product launch overrides for A/B runs (`augury.layers.launch_env`)."""

from __future__ import annotations

import pytest

from tests.triton_env import interpreter

interpreter()  # before triton's first import: the kernel modules import it

from augury.layers import launch_env, triton_gemv, triton_gemv_w4, triton_gemv_w4r  # noqa: E402
from augury.layers.triton_gemv import GemvConfig  # noqa: E402
from augury.layers.triton_gemv_w4r import W4RowsConfig  # noqa: E402


def test_parse_and_apply_per_product():
    t = launch_env.parse("V", "down:late_launch=1,block_n=32; qkv:block_k=1024", GemvConfig)
    assert t == {"down": {"late_launch": True, "block_n": 32}, "qkv": {"block_k": 1024}}
    base = GemvConfig(block_n=16, block_k=1024, num_warps=8)
    assert launch_env.apply(base, "down", t) == GemvConfig(16 * 2, 1024, 8, late_launch=True)
    assert launch_env.apply(base, "o_proj", t) is base
    assert launch_env.parse("V", "", GemvConfig) == {}


@pytest.mark.parametrize("text,word", [("down", "product:field"), ("mlp:stages=1", "product:field"),
                                       ("down:nope=1", "field=integer"), ("down:stages=x", "field=integer")])
def test_malformed_overrides_name_the_variable(text, word):
    with pytest.raises(ValueError, match=f"AUGURY_W4R_CFG: .*{word}"):
        launch_env.parse("AUGURY_W4R_CFG", text, W4RowsConfig)


def test_default_configs_take_the_table_for_their_product(monkeypatch):
    monkeypatch.setattr(triton_gemv, "_ENV_CFG", {"down": {"late_launch": True}})
    assert triton_gemv.default_config(4096, 14336).late_launch
    assert not triton_gemv.default_config(4096, 4096).late_launch
    monkeypatch.setattr(triton_gemv_w4r, "_ENV_CFG", {"down": {"rows_per_program": 256}, "qkv": {"stages": 1}})
    assert triton_gemv_w4r.default_config(4096, 14336).rows_per_program == 256
    assert triton_gemv_w4r.default_config(6144, 4096).stages == 1
    assert triton_gemv_w4r.default_config(28672, 4096) == triton_gemv_w4r._DEFAULTS["gate_up"]
    monkeypatch.setattr(triton_gemv_w4, "_ENV_CFG", {"o_proj": {"late_launch": True}})
    assert triton_gemv_w4.default_config(4096, 4096, 8).late_launch
    assert not triton_gemv_w4.default_config(4096, 14336, 8).late_launch
    names = {triton_gemv.product_class(n, k) for n, k in ((6144, 4096), (4096, 4096), (28672, 4096), (4096, 14336),
                                                          (128256, 4096))}
    assert names == set(launch_env.PRODUCTS)
    assert {triton_gemv_w4r.product_class(n, k) for n, k in ((6144, 4096), (4096, 4096), (28672, 4096),
                                                              (4096, 14336), (128256, 4096))} == names
