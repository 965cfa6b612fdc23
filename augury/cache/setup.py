"""Build an engine's prefix cache from its config (the one place engine/ calls into cache/)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from augury.cache.companion import CompanionDrafter, model_fingerprint
from augury.cache.namespace import CacheNamespace
from augury.cache.prefix_cache import PrefixCache
from augury.cache.ssd_store import SSDStore
from augury.kv.pool import parse_bytes

if TYPE_CHECKING:
    from augury.engine.engine import Engine

DEFAULT_SSD_BYTES = "16GiB"


def engine_namespace(loaded, config, kv_codec_id: str | None = None) -> CacheNamespace:
    """Namespace of the target's KV: weights+config, tokenizer, compute dtype, weight quantization.
    The KV codec is not in it: each block's hash carries its storage class (codec and
    parameters, see kv/block_manager.py), so blocks are reused only at their own precision."""
    codec = kv_codec_id or str(loaded.dtype).removeprefix("torch.")
    return CacheNamespace(loaded.fingerprint, loaded.tokenizer.fingerprint, codec, config.weights)


def _bytes(v) -> int | None:
    if v is None or v == "":
        return None
    return int(v) if isinstance(v, int) else parse_bytes(str(v))


def attach_prefix_cache(engine: "Engine", namespace: CacheNamespace) -> PrefixCache | None:
    """RAM-tier budget and SSD tier for the engine's pool, plus companion caches for
    drafters with their own pools (wrapped in place in `engine.drafters`)."""
    cfg = engine.config
    if not cfg.enable_prefix_caching:
        return None
    store = None
    ssd_dir = getattr(cfg, "ssd_cache_dir", None)
    if ssd_dir:
        store = SSDStore(ssd_dir, _bytes(getattr(cfg, "ssd_cache_bytes", None)) or parse_bytes(DEFAULT_SSD_BYTES))
    ram = _bytes(getattr(cfg, "prompt_cache_bytes", None))
    persist = bool(getattr(cfg, "ssd_persist_before_evict", True))
    pc = PrefixCache(engine.blocks, engine.pool, store, ram, persist_before_evict=persist)
    for name, d in list(engine.drafters.items()):
        if not all(hasattr(d, a) for a in ("blocks", "pool", "computed", "model")):
            continue  # stateless drafters (ngram) have nothing to cache
        fp = model_fingerprint(d.model, getattr(d, "cfg", None))
        ns = namespace.companion(f"draft:{fp}").key()
        share = None if ram is None else int(ram * d.pool.nbytes() / max(1, engine.pool.nbytes()))
        pc.companions[name] = PrefixCache(d.blocks, d.pool, store, share, persist_before_evict=persist)
        engine.drafters[name] = CompanionDrafter(d, ns)
    return pc
