"""Prefix-cache namespaces: which cached KV may serve which request.

Two requests may share KV only if every input that shapes the KV bytes is the
same: the weights and config (model fingerprint), how text became ids
(tokenizer), how KV is stored (codec and its parameters), how weights were
quantized, and the method/adapter that produced the state (a draft model's KV
lives in its own namespace under the target's).
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass


@dataclass(frozen=True)
class CacheNamespace:
    model_fingerprint: str
    tokenizer_fingerprint: str
    kv_codec_id: str  # e.g. "torch.float32"; a KV-codec adds its params here ("affine-int8:g64")
    weights: str = "native"  # weight-only quantization of the linears
    method: str = ""  # adapter / speculative method; "" = the plain target

    def key(self) -> str:
        """The string that seeds the chained block hashes and heads every file."""
        base = f"{self.model_fingerprint}:{self.tokenizer_fingerprint}:{self.kv_codec_id}:{self.weights}"
        return f"{base}/{self.method}" if self.method else base

    def companion(self, method: str) -> "CacheNamespace":
        """A speculative method's own state for the same prefixes (`<ns>/draft:<fp>`)."""
        m = f"{self.method}/{method}" if self.method else method
        return CacheNamespace(self.model_fingerprint, self.tokenizer_fingerprint, self.kv_codec_id,
                              self.weights, m)


def namespace_digest(key: str) -> str:
    """Short, filesystem-safe name for a namespace key (directory name on disk)."""
    return hashlib.blake2b(key.encode(), digest_size=8).hexdigest()
