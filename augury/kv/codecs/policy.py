"""Building a KVCodec from the names users type: engine flags and the API's `kv_cache` field.

Strings: "native", "affine8", "affine4" (mlx-lm's --kv-bits), "turbo" (= k8v3),
"turbo:k8v3", "turbo:k4v3"; a key spec prefixed with "r" rotates the keys first
("turbo:rk4v3"), with "c" stores rotated keys with the normal codebook too
("turbo:ck4v3").
A "+qjl" suffix (or "+qjl<m>" for an m-row sketch) adds the QJL 1-bit key
residual (augury.kv.codecs.qjl): "turbo:rk4v3+qjl", "affine4-rk+qjl".
API dict: {"codec": "native"|"affine"|"turbo", "key_bits", "value_bits",
"group_size", "start", "rotate_keys", "qjl", "qjl_dim"}.
"""

from __future__ import annotations

import re
from typing import Any

from augury.kv.codecs.affine import AffineCodec
from augury.kv.codecs.base import CodecError, KVCodec, SideCodec
from augury.kv.codecs.native import NativeCodec
from augury.kv.codecs.qjl import QJLResidualCodec
from augury.kv.codecs.turboquant import CODEBOOK_BITS, TurboCodec

AFFINE_GROUP_DEFAULT = 64  # mlx-lm's default kv_group_size
TURBO_KEY_GROUP_DEFAULT = 32  # the TurboQuant reference's int8 keys: 9 bits/element with scales
KEY_BITS = (2, 3, 4, 5, 8)

_TURBO_RE = re.compile(r"^(?P<kmode>[rc]?)k(?P<kb>\d+)v(?P<vb>\d+)$")
_QJL_RE = re.compile(r"\+qjl(\d*)$")


def native_codec() -> KVCodec:
    n = NativeCodec()
    return KVCodec(n, n, 0, "native")


def affine_codec(bits: int, group_size: int = AFFINE_GROUP_DEFAULT, start: int = 0,
                 rotate: bool = False) -> KVCodec:
    side_k = AffineCodec(bits, group_size, rotate=rotate)
    side_v = AffineCodec(bits, group_size)
    name = f"affine{bits}" + ("-rk" if rotate else "")
    return KVCodec(side_k, side_v, start, name)


def turbo_codec(key_bits: int = 8, value_bits: int = 3, key_group: int | None = None, start: int = 0,
                key_mode: str = "") -> KVCodec:
    """key_mode: "" affine keys, "r" rotated affine keys, "c" rotated codebook keys."""
    if value_bits not in CODEBOOK_BITS:
        raise CodecError(f"turbo value bits must be one of {CODEBOOK_BITS}, got {value_bits}")
    if key_bits not in KEY_BITS:
        raise CodecError(f"turbo key bits must be one of {KEY_BITS}, got {key_bits}")
    g = key_group or TURBO_KEY_GROUP_DEFAULT
    key: SideCodec
    if key_mode == "c":
        if key_bits not in CODEBOOK_BITS:
            raise CodecError(f"codebook keys need bits in {CODEBOOK_BITS}")
        key = TurboCodec(key_bits, 32, seed=0x6B)
    else:
        key = AffineCodec(key_bits, g, rotate=key_mode == "r")
    return KVCodec(key, TurboCodec(value_bits), start, f"turbo-{key_mode}k{key_bits}v{value_bits}")


def with_qjl(codec: KVCodec, sketch_dim: int | None = None) -> KVCodec:
    """The same codec with the QJL 1-bit residual on its keys."""
    if codec.is_native or codec.key.is_native:
        raise CodecError("the QJL key residual needs an encoded key codec (affine or turbo)")
    m = "" if sketch_dim is None else str(sketch_dim)
    return KVCodec(QJLResidualCodec(codec.key, sketch_dim), codec.value, codec.start, f"{codec.name}+qjl{m}")


def parse_codec(spec: str, group_size: int | None = None, start: int = 0) -> KVCodec:
    """A codec from its short name (see the module doc)."""
    s = spec.strip().lower()
    q = _QJL_RE.search(s)
    if q:
        return with_qjl(parse_codec(s[:q.start()], group_size, start), int(q.group(1)) if q.group(1) else None)
    if s in ("native", "none", "bf16", "fp16", "f16", "off", ""):
        return native_codec()
    m = re.fullmatch(r"(affine|int)(\d+)(-rk)?", s)
    if m:
        return affine_codec(int(m.group(2)), group_size or AFFINE_GROUP_DEFAULT, start, rotate=bool(m.group(3)))
    if s == "turbo" or s.startswith("turbo:") or s.startswith("turbo-"):
        rest = s[6:] or "k8v3"
        t = _TURBO_RE.match(rest)
        if not t:
            raise CodecError(f"--kv-quant {spec!r}: expected turbo[:k8v3] (key bits {KEY_BITS}, "
                             f"value bits {CODEBOOK_BITS}, optional r/c before k)")
        return turbo_codec(int(t.group("kb")), int(t.group("vb")), group_size, start, t.group("kmode"))
    raise CodecError(f"unknown KV codec {spec!r}; choose native, affine8, affine4 or turbo[:k8v3]")


def codec_from_flags(kv_bits: int | None = None, kv_group_size: int | None = None,
                     kv_quant: str | None = None, quantized_kv_start: int = 0) -> KVCodec:
    """The server default from mlx-lm-named flags; --kv-quant wins over --kv-bits."""
    if quantized_kv_start < 0:
        raise CodecError("--quantized-kv-start must be >= 0")
    if kv_quant:
        return parse_codec(kv_quant, kv_group_size, quantized_kv_start)
    if kv_bits:
        return affine_codec(int(kv_bits), kv_group_size or AFFINE_GROUP_DEFAULT, quantized_kv_start)
    return native_codec()


def codec_from_request(d: dict[str, Any], default: KVCodec) -> KVCodec:
    """The API's `kv_cache` object -> KVCodec; unspecified fields fall back to the server's."""
    if not isinstance(d, dict):
        raise CodecError("kv_cache: must be an object {codec, key_bits, value_bits, group_size, start}")
    known = {"codec", "key_bits", "value_bits", "group_size", "start", "rotate_keys", "qjl", "qjl_dim"}
    extra = set(d) - known
    if extra:
        raise CodecError(f"kv_cache: unknown field(s) {', '.join(sorted(extra))}")
    if d.get("qjl") or d.get("qjl_dim"):
        base = codec_from_request({k: v for k, v in d.items() if k not in ("qjl", "qjl_dim")}, default)
        if isinstance(base.key, QJLResidualCodec) and not d.get("qjl_dim"):
            return base  # the server default already carries the residual
        if base.key.is_native:
            raise CodecError("kv_cache.qjl: needs an affine or turbo codec (the residual is on encoded keys)")
        key = base.key.base if isinstance(base.key, QJLResidualCodec) else base.key
        return with_qjl(KVCodec(key, base.value, base.start, base.name.split("+qjl")[0]),
                        int(d["qjl_dim"]) if d.get("qjl_dim") else None)
    kind = d.get("codec")
    start = int(d.get("start", default.start) or 0)
    if start < 0:
        raise CodecError("kv_cache.start: must be >= 0")
    if kind is None:
        return default if start == default.start else KVCodec(default.key, default.value, start, default.name)
    if kind == "native":
        return native_codec()
    if kind == "affine":
        bits = int(d.get("key_bits") or d.get("value_bits") or 8)
        if d.get("value_bits") not in (None, bits):
            raise CodecError("kv_cache: affine uses one width for keys and values")
        return affine_codec(bits, int(d.get("group_size") or AFFINE_GROUP_DEFAULT), start,
                            rotate=bool(d.get("rotate_keys", False)))
    if kind == "turbo":
        return turbo_codec(int(d.get("key_bits") or 8), int(d.get("value_bits") or 3),
                           d.get("group_size"), start, "r" if d.get("rotate_keys") else "")
    raise CodecError(f"kv_cache.codec: {kind!r} is not one of native, affine, turbo")
