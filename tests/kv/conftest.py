"""Fixtures shared by the KV codec tests."""

from __future__ import annotations

import pytest

from tests.conftest import make_tiny_hf_model


@pytest.fixture(scope="session")
def hd64_dir(tmp_path_factory):
    """A tiny llama with head_dim 64: what the Hadamard transform and 32-wide groups need."""
    return make_tiny_hf_model(tmp_path_factory.mktemp("tiny_hd64"), "llama", hidden_size=128,
                              num_attention_heads=2, num_key_value_heads=1)
