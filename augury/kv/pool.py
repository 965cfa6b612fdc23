"""The KV pool tensors: one flat slot array per layer, grouped like the block manager.

Slot s of a layer stores the K (and V) of one token: slot = block_id * block_size
+ offset. Layers of a group share block ids (one table per group per request).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from augury.config import ModelConfig
from augury.kv.block_manager import KVGroup
from augury.kv.classed import ClassedStore
from augury.kv.codecs import EncodedStore, KVCodec

_UNITS = {"k": 1024, "m": 1024**2, "g": 1024**3, "t": 1024**4}


def parse_bytes(text: str) -> int:
    """'2GiB', '512MB', '1.5g', '123456' → bytes."""
    s = text.strip().lower().replace("ib", "").replace("b", "")
    if s and s[-1] in _UNITS:
        return int(float(s[:-1]) * _UNITS[s[-1]])
    return int(float(s))


def available_memory_bytes(device: torch.device) -> int:
    if device.type == "cuda":
        free, _ = torch.cuda.mem_get_info(device)
        return int(free)
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 4 * 1024**3


def bytes_per_token_per_layer(cfg: ModelConfig, dtype: torch.dtype, codec: KVCodec | None = None) -> int:
    """K + V bytes one token costs in one layer: the real encoded bytes (scales included)."""
    if codec is not None and not codec.is_native:
        return codec.bytes_per_token_per_layer(cfg.num_kv_heads, cfg.head_dim, dtype)
    return 2 * cfg.num_kv_heads * cfg.head_dim * torch.empty((), dtype=dtype).element_size()


def plan_groups(cfg: ModelConfig, dtype: torch.dtype, budget_bytes: int, block_size: int,
                max_num_seqs: int, max_batched_tokens: int, codec: KVCodec | None = None) -> list[KVGroup]:
    """Split a byte budget into per-group block counts (blocks sized by the codec's bytes).

    The sliding group needs at most window + one prefill chunk per running request,
    so it gets just that (but at most half the budget when there are full layers:
    admission then waits for sliding blocks); the rest goes to the full-attention group.
    """
    per_tok = bytes_per_token_per_layer(cfg, dtype, codec)
    n_sliding = sum(1 for i in range(cfg.num_layers) if cfg.is_sliding(i))
    n_full = cfg.num_layers - n_sliding
    groups: list[KVGroup] = []
    sliding_bytes = 0
    if n_sliding:
        w = cfg.sliding_window or 0
        per_seq = -(-(w + max_batched_tokens) // block_size) + 2
        block_bytes = block_size * per_tok * n_sliding
        n_blocks = max_num_seqs * per_seq
        if n_full:
            n_blocks = max(per_seq, min(n_blocks, budget_bytes // 2 // block_bytes))
        sliding_bytes = n_blocks * block_bytes
        if n_full == 0:
            n_blocks = max(n_blocks, budget_bytes // (block_size * per_tok * n_sliding))
        groups.append(KVGroup("sliding", n_blocks, w))
    if n_full:
        left = budget_bytes - sliding_bytes
        n_blocks = left // (block_size * per_tok * n_full)
        if n_blocks < 2:
            raise ValueError(
                f"KV budget of {budget_bytes} bytes is too small for this model; raise --kv-budget"
            )
        groups.insert(0, KVGroup("full", int(n_blocks), None))
    return groups


def base_codec(codec: KVCodec) -> KVCodec:
    """The codec without its `start` (a pool stores codecs; boundaries are per request)."""
    return KVCodec(codec.key, codec.value, 0, codec.name)


def class_name(codec: KVCodec | None) -> str:
    """A codec's storage-class name: "" for native (so native block hashes are the same in
    every pool), else the codec's id without its `start`."""
    if codec is None or codec.is_native:
        return ""
    return base_codec(codec).id


def plan_class_groups(cfg: ModelConfig, dtype: torch.dtype, budget_bytes: int, block_size: int, max_num_seqs: int,
                      max_batched_tokens: int, codecs: dict[str, KVCodec],
                      shares: dict[str, float]) -> list[KVGroup]:
    """`plan_groups` per storage class on its share of the budget, merged: each group's
    blocks are the classes' blocks, in the order of `codecs`."""
    merged: dict[str, tuple[KVGroup, list[tuple[str, int]]]] = {}
    for cls, codec in codecs.items():
        for g in plan_groups(cfg, dtype, int(budget_bytes * shares[cls]), block_size, max_num_seqs,
                             max_batched_tokens, codec):
            merged.setdefault(g.name, (g, []))[1].append((cls, g.num_blocks))
    return [KVGroup(g.name, sum(n for _, n in cl), g.window, tuple(cl)) for g, cl in merged.values()]


@dataclass
class KVPool:
    # per layer [num_slots, Hkv, D] in the compute dtype, or an EncodedStore when the
    # pool's codec is not native (attention branches on the type)
    k: list[torch.Tensor | EncodedStore]
    v: list[torch.Tensor | EncodedStore]
    group_of_layer: list[str]
    block_size: int
    codec: KVCodec | None = None  # None = native
    # several storage classes (kv/classed.py): class -> codec, and each group's slot ranges
    classes: dict[str, KVCodec] | None = None
    class_ranges: dict[str, list[tuple[str, int, int]]] | None = None

    @classmethod
    def allocate(cls, cfg: ModelConfig, groups: list[KVGroup], block_size: int,
                 dtype: torch.dtype, device: torch.device, codec: KVCodec | None = None,
                 classes: dict[str, KVCodec] | None = None) -> "KVPool":
        """Sliding-window layers use the same codec as full ones (their slots are read the same way).
        With `classes` (more than one), each layer gets one store per class (ClassedStore)."""
        if classes is not None and len(classes) > 1:
            return cls._allocate_classed(cfg, groups, block_size, dtype, device, classes)
        by_name = {g.name: g for g in groups}
        encoded = codec is not None and not codec.is_native
        if encoded:
            codec.bind(cfg.head_dim)
        ks, vs, names = [], [], []
        for i in range(cfg.num_layers):
            name = "sliding" if cfg.is_sliding(i) else "full"
            slots = by_name[name].num_blocks * block_size
            if encoded:
                ks.append(EncodedStore(codec.key, slots, cfg.num_kv_heads, cfg.head_dim, dtype, device))
                vs.append(EncodedStore(codec.value, slots, cfg.num_kv_heads, cfg.head_dim, dtype, device))
            else:
                shape = (slots, cfg.num_kv_heads, cfg.head_dim)
                ks.append(torch.zeros(shape, dtype=dtype, device=device))
                vs.append(torch.zeros(shape, dtype=dtype, device=device))
            names.append(name)
        return cls(ks, vs, names, block_size, codec if encoded else None)

    @classmethod
    def _allocate_classed(cls, cfg: ModelConfig, groups: list[KVGroup], block_size: int, dtype: torch.dtype,
                          device: torch.device, classes: dict[str, KVCodec]) -> "KVPool":
        by_name = {g.name: g for g in groups}
        ranges = {g.name: [(c, lo * block_size, hi * block_size) for c, lo, hi in g.class_ranges()] for g in groups}

        def store(codec: KVCodec, side: str, slots: int):
            if codec.is_native:
                return torch.zeros((slots, cfg.num_kv_heads, cfg.head_dim), dtype=dtype, device=device)
            return EncodedStore(getattr(codec, side), slots, cfg.num_kv_heads, cfg.head_dim, dtype, device)

        for codec in classes.values():
            if not codec.is_native:
                codec.bind(cfg.head_dim)
        ks, vs, names = [], [], []
        for i in range(cfg.num_layers):
            name = "sliding" if cfg.is_sliding(i) else "full"
            rs = ranges[by_name[name].name]
            ks.append(ClassedStore({c: (store(classes[c], "key", hi - lo), lo) for c, lo, hi in rs}))
            vs.append(ClassedStore({c: (store(classes[c], "value", hi - lo), lo) for c, lo, hi in rs}))
            names.append(name)
        return cls(ks, vs, names, block_size, None, dict(classes), ranges)

    def class_tensors(self, layer: int, cls: str) -> list[torch.Tensor]:
        """Every [num_slots, ...] tensor of one layer's class, K then V (a codec's parts)."""
        out: list[torch.Tensor] = []
        for side in (self.k[layer], self.v[layer]):
            if isinstance(side, ClassedStore):
                out.extend(side.tensors(cls))
            else:
                out.extend(side.parts if isinstance(side, EncodedStore) else [side])
        return out

    @property
    def device(self) -> torch.device:
        k0 = self.k[0]
        if isinstance(k0, ClassedStore):
            return k0.device
        return k0.device if isinstance(k0, torch.Tensor) else k0.parts[0].device

    def nbytes(self) -> int:
        return sum(t.nbytes() if isinstance(t, (EncodedStore, ClassedStore)) else t.numel() * t.element_size()
                   for t in self.k + self.v)
