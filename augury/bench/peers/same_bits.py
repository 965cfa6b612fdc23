"""A copy of a GGUF whose output head has the bits augury gives it, for a same-bytes llama.cpp peer.

augury's `--weights int4` quantizes every projection to 4 bits (g32), the LM head too. A Q4 GGUF
often keeps its token embedding (which tied models such as SmolLM2 also use as the LM head) at
Q8_0: llama.cpp then reads that head at 8.5 bits a weight. For SmolLM2 that is 30.1 MB of its
96.4 MB a token, where augury reads 17.7 MB of 84.0 MB, so the stock comparison is not at the
same bits. llama.cpp's own quantizer (through llama-cpp-python) rewrites the embedding and the
output tensor at the layers' 4-bit type, leaving the layers' blocks as they are; `llama.cpp-q4head`
runs that copy, reading what augury reads.
"""

from __future__ import annotations

import collections
import ctypes
from pathlib import Path

from augury.bench.peers.base import PeerUnavailable

_GGML_TYPE = {"Q4_0": 2, "Q4_1": 3}  # ggml_type ids
_FTYPE = {"Q4_0": 2, "Q4_1": 3}  # llama_ftype LLAMA_FTYPE_MOSTLY_*


def tensor_types(path: Path) -> tuple[str, str | None]:
    """(the type holding most of the blocks' bytes, the token embedding's / output's type)."""
    from gguf import GGUFReader

    r = GGUFReader(str(path))
    blocks: collections.Counter = collections.Counter()
    head = None
    for t in r.tensors:
        if t.name.startswith("blk."):
            blocks[t.tensor_type.name] += int(t.n_bytes)
        elif t.name in ("output.weight", "token_embd.weight") and (head is None or t.name == "output.weight"):
            head = t.tensor_type.name
    return blocks.most_common(1)[0][0], head


def needs_copy(path: Path) -> bool:
    """Whether the GGUF's head bits differ from its 4-bit layers' (a same-bytes peer is informative)."""
    layers, head = tensor_types(path)
    return layers in _GGML_TYPE and head is not None and head != layers


def same_bits_gguf(src: Path, cache_dir: Path) -> Path:
    """The copy with embedding and output at the layers' type (made once; reused while src is unchanged)."""
    from augury.bench.peers.llamacpp_peer import import_llama_cpp

    layers, _ = tensor_types(src)
    if layers not in _GGML_TYPE:
        raise PeerUnavailable(f"{src.name}: layers are {layers}; the same-bits copy is for Q4_0 / Q4_1 GGUFs")
    st = src.stat()
    dst = Path(cache_dir) / f"{src.stem}.{layers.lower()}-head.{st.st_size}.{int(st.st_mtime)}.gguf"
    if dst.exists():
        return dst
    lc = import_llama_cpp()
    dst.parent.mkdir(parents=True, exist_ok=True)
    tmp = dst.with_suffix(".partial")
    p = lc.llama_model_quantize_default_params()
    p.ftype = _FTYPE[layers]
    p.allow_requantize = True  # the layers are already Q4: they are copied, not re-quantized
    p.token_embedding_type = _GGML_TYPE[layers]
    p.output_tensor_type = _GGML_TYPE[layers]
    rc = lc.llama_model_quantize(str(src).encode(), str(tmp).encode(), ctypes.byref(p))
    if rc != 0 or not tmp.exists():
        raise PeerUnavailable(f"llama.cpp's quantizer failed on {src.name} (rc {rc})")
    if _block_types(tmp) != _block_types(src):  # a mixed file: some layer would have been re-quantized
        tmp.unlink()
        raise PeerUnavailable(f"{src.name}: its layers mix quant types; the copy would not keep them as they are")
    tmp.replace(dst)
    return dst


def _block_types(path: Path) -> dict[str, str]:
    from gguf import GGUFReader

    return {t.name: t.tensor_type.name for t in GGUFReader(str(path)).tensors if t.name.startswith("blk.")}
