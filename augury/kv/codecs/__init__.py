"""KV-cache codecs: how K and V rows are stored in the pool (native, affine, turbo, + QJL key residual)."""

from augury.kv.codecs.affine import AffineCodec
from augury.kv.codecs.base import CodecError, FieldSpec, KVCodec, SideCodec
from augury.kv.codecs.native import NativeCodec
from augury.kv.codecs.qjl import QJLResidualCodec
from augury.kv.codecs.policy import (
    affine_codec,
    codec_from_flags,
    codec_from_request,
    native_codec,
    parse_codec,
    turbo_codec,
    with_qjl,
)
from augury.kv.codecs.store import EncodedStore
from augury.kv.codecs.turboquant import TurboCodec

__all__ = [
    "AffineCodec", "CodecError", "EncodedStore", "FieldSpec", "KVCodec", "NativeCodec", "QJLResidualCodec",
    "SideCodec", "TurboCodec", "affine_codec", "codec_from_flags", "codec_from_request", "native_codec",
    "parse_codec", "turbo_codec", "with_qjl",
]
