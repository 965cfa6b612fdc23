"""llama.cpp through llama-cpp-python, on the very GGUF file augury loaded, with the same thread count."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any, Sequence

from augury.bench.peers.base import BatchTiming, GenTiming, PeerUnavailable, time_stream

INSTALL_HINT = ("pip install llama-cpp-python  (builds llama.cpp from source: a few minutes; "
                "0.3.36 was used for the published numbers)")


def import_llama_cpp() -> Any:
    """The llama_cpp module, or PeerUnavailable with the install command."""
    try:
        import llama_cpp
    except ImportError as e:
        raise PeerUnavailable(f"llama_cpp is not importable ({e}); {INSTALL_HINT}") from None
    return llama_cpp


class LlamaCppPeer:
    def __init__(self, llm: Any, eos: Sequence[int], name: str = "llama.cpp"):
        self.llm = llm
        self.eos = frozenset(int(t) for t in eos)
        self.name = name

    @classmethod
    def load(cls, gguf_path: Path, eos: Sequence[int], threads: int, n_ctx: int = 8192,
             prompt_lookup: int | None = None, same_bits: bool = False) -> "LlamaCppPeer":
        """prompt_lookup=N: llama-cpp-python's own prompt-lookup drafter proposing N tokens.
        same_bits: run a copy of the GGUF whose head has the layers' 4 bits, as augury's int4 head
        (peers/same_bits.py), named `llama.cpp-q4head`."""
        if Path(gguf_path).suffix.lower() != ".gguf":
            raise PeerUnavailable(f"llama.cpp needs a .gguf file; the model resolved to {gguf_path}")
        lc = import_llama_cpp()
        draft = None
        name = "llama.cpp"
        if same_bits:
            from augury.bench.peers.same_bits import same_bits_gguf
            from augury.weights.paths import cache_root

            gguf_path = same_bits_gguf(Path(gguf_path), cache_root() / "bench")
            name = "llama.cpp-q4head"
        if prompt_lookup:
            from llama_cpp.llama_speculative import LlamaPromptLookupDecoding

            draft = LlamaPromptLookupDecoding(num_pred_tokens=prompt_lookup)
            name = f"llama.cpp-pld{prompt_lookup}"
        llm = lc.Llama(model_path=str(gguf_path), n_ctx=n_ctx, n_batch=512, n_threads=threads,
                       n_threads_batch=threads, verbose=False, draft_model=draft)
        return cls(llm, eos, name)

    def generate(self, ids: Sequence[int], max_tokens: int, ignore_eos: bool = True,
                 method: str | None = None) -> GenTiming:
        if method:
            raise ValueError("llama.cpp peer: the drafter is chosen at load (prompt_lookup=N)")
        # reset: forget the previous prompt so its KV is not reused (the harness disables augury's prefix cache too)
        self.llm.reset()
        t0 = time.perf_counter()
        stream = self.llm.generate(list(ids), temp=0.0, top_k=1, top_p=1.0, min_p=0.0, repeat_penalty=1.0)
        return time_stream(stream, len(ids), max_tokens, self.eos, ignore_eos, t0)

    def generate_batch(self, prompts: Sequence[Sequence[int]], max_tokens: int) -> BatchTiming | None:
        # llama-cpp-python's Llama decodes one sequence; its server serves requests one at a time
        return None

    def close(self) -> None:
        self.llm.close() if hasattr(self.llm, "close") else None
        self.llm = None
