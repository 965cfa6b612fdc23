"""HF transformers on the same GGUF file (dequantized to fp32 by transformers): the reference eager stack."""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Sequence

from augury.bench.peers.base import BatchTiming, GenTiming, PeerUnavailable


class _Clock:
    """A generate() streamer that only notes when each step's tokens arrive (first put is the prompt)."""

    def __init__(self) -> None:
        self.times: list[float] = []

    def put(self, value) -> None:  # noqa: ANN001 - transformers passes a tensor
        self.times.append(time.perf_counter())

    def end(self) -> None:
        pass


class HFPeer:
    name = "hf"

    def __init__(self, model, eos: Sequence[int]):  # noqa: ANN001
        self.model = model
        self.eos = list(eos)

    @classmethod
    def load(cls, gguf_path: Path, eos: Sequence[int], threads: int) -> "HFPeer":
        if Path(gguf_path).suffix.lower() != ".gguf":
            raise PeerUnavailable(f"hf peer loads the model's GGUF file; {gguf_path} is not one")
        try:
            import torch
            from transformers import AutoModelForCausalLM
        except ImportError as e:
            raise PeerUnavailable(f"transformers is not importable ({e}); pip install transformers") from None
        os.environ.setdefault("HF_HUB_OFFLINE", "1")
        torch.set_num_threads(threads)
        p = Path(gguf_path)
        model = AutoModelForCausalLM.from_pretrained(str(p.parent), gguf_file=p.name, dtype=torch.float32)
        model.eval()
        return cls(model, eos)

    def _run(self, ids_2d, max_tokens: int, ignore_eos: bool):  # noqa: ANN001
        import torch

        clock = _Clock()
        kw = dict(max_new_tokens=max_tokens, do_sample=False, temperature=None, top_p=None, top_k=None,
                  streamer=clock, pad_token_id=self.eos[0] if self.eos else 0,
                  attention_mask=torch.ones_like(ids_2d))
        if ignore_eos:
            kw["min_new_tokens"] = max_tokens
        else:
            kw["eos_token_id"] = self.eos
        t0 = time.perf_counter()
        with torch.inference_mode():
            out = self.model.generate(ids_2d, **kw)
        return out, clock.times, t0, time.perf_counter()

    def generate(self, ids: Sequence[int], max_tokens: int, ignore_eos: bool = True,
                 method: str | None = None) -> GenTiming:
        import torch

        if method:
            raise ValueError("hf peer: no speculative methods")
        x = torch.tensor([list(ids)], dtype=torch.long)
        out, times, t0, t1 = self._run(x, max_tokens, ignore_eos)
        n = out.shape[1] - x.shape[1]
        ttft = (times[1] - t0) if len(times) > 1 else t1 - t0
        return GenTiming(len(ids), n, ttft, t1 - t0)

    def generate_batch(self, prompts: Sequence[Sequence[int]], max_tokens: int) -> BatchTiming:
        import torch

        x = torch.tensor([list(p) for p in prompts], dtype=torch.long)  # equal lengths: no padding
        out, _, t0, t1 = self._run(x, max_tokens, True)
        return BatchTiming((out.shape[1] - x.shape[1]) * x.shape[0], t1 - t0)

    def close(self) -> None:
        self.model = None
