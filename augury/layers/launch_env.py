"""Per-product launch overrides from the environment, for end-to-end A/B runs of decode kernels.

    AUGURY_GEMV_CFG="down:late_launch=1;qkv:block_k=1024"         (bf16 one-row GEMV, `GemvConfig`)
    AUGURY_W4R_CFG="down:rows_per_program=256,stages=1"            (int4 row-layout GEMV, `W4RowsConfig`)
    AUGURY_W4M_CFG="qkv:num_warps=4,rows_per_program=256"          (int4 tensor-core GEMV, `W4MmaConfig`)

Products are named by the shape class the kernel's `default_config` picks for them (qkv, o_proj,
gate_up, down, lm_head); fields are the config dataclass's, values integers (booleans as 0/1).
Read once at import: a captured step always launches the same grid. A malformed value is an error
naming the variable, not a silent default."""

from __future__ import annotations

import dataclasses
import os

PRODUCTS = ("qkv", "o_proj", "gate_up", "down", "lm_head")


def parse(var: str, text: str, config_type: type) -> dict[str, dict[str, int | bool]]:
    """"product:field=value,field=value;product:..." -> {product: {field: value}} for `config_type`."""
    fields = {f.name: f.type for f in dataclasses.fields(config_type)}
    out: dict[str, dict[str, int | bool]] = {}
    for part in filter(None, (p.strip() for p in text.split(";"))):
        name, sep, body = part.partition(":")
        if not sep or name not in PRODUCTS:
            raise ValueError(f"{var}: {part!r} is not product:field=value (products: {', '.join(PRODUCTS)})")
        for item in filter(None, (i.strip() for i in body.split(","))):
            key, eq, val = item.partition("=")
            if not eq or key not in fields or not val.lstrip("-").isdigit():
                raise ValueError(f"{var}: {item!r} is not field=integer (fields: {', '.join(fields)})")
            out.setdefault(name, {})[key] = bool(int(val)) if fields[key] in ("bool", bool) else int(val)
    return out


def overrides(var: str, config_type: type) -> dict[str, dict[str, int | bool]]:
    return parse(var, os.environ.get(var, ""), config_type)


def apply(cfg, product: str, table: dict[str, dict[str, int | bool]]):
    """cfg with `table`'s fields for this product replaced (cfg itself where it names none)."""
    over = table.get(product)
    return dataclasses.replace(cfg, **over) if over else cfg
