"""Model + tokenizer from a name or path: the one place the engine touches weights/."""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass
from typing import Any

import torch

from augury.config import EngineConfig, ModelConfig
from augury.tokenizer.tokenizer import Tokenizer
from augury.weights.loader import load_checkpoint

log = logging.getLogger("augury")

_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


@dataclass
class LoadedModel:
    name: str
    model: torch.nn.Module
    config: ModelConfig
    tokenizer: Tokenizer
    device: torch.device
    dtype: torch.dtype
    fingerprint: str
    eos_token_ids: list[int]
    generation_config: dict[str, Any]


def pick_device(spec: str) -> torch.device:
    if spec == "auto":
        env = os.environ.get("AUGURY_DEVICE")
        if env:
            return torch.device(env)
        if torch.cuda.is_available():
            return torch.device("cuda")
        return torch.device("cpu")
    dev = torch.device(spec)
    if dev.type == "cuda" and not torch.cuda.is_available():
        raise ValueError("--device cuda: no CUDA device is available; use --device cpu")
    return dev


def pick_dtype(spec: str, device: torch.device) -> torch.dtype:
    if spec == "auto":
        return torch.bfloat16 if device.type == "cuda" else torch.float32
    return _DTYPES[spec]


def maybe_compile(model: torch.nn.Module, cfg: EngineConfig) -> None:
    """--compile: one graph for every step shape (dynamic=True); compute_logits stays eager.

    Every input the graphs see must look alike from step to step, or dynamo recompiles until its
    limit (8) and then runs that frame eagerly: so the additive masks are built before the call
    (CUDA-graph metadata arrives with them, eager steps without: a guard on that cache's keys
    told the two apart), and on the CPU attention is one opaque op (layers/attention_cpu_op.py)."""
    if not cfg.compile:
        return
    import augury.layers.attention_cpu_op  # noqa: F401  (registers the op CPU graphs call)
    from augury.cpu_kernels import load
    from augury.layers.attention import prepare_masks

    load()  # build / load the native kernels now: a graph must not trace their build

    # what is left is structural and bounded: one row or several (size 1 is always specialized),
    # a lone batch or several requests, decodes with or without a verify/prefill segment beside
    # them, prefill sizes past the int4 kernels' dense switch. A long-running server meets more
    # of those than dynamo's default limit of 8, after which the frame would run eagerly
    torch._dynamo.config.recompile_limit = max(torch._dynamo.config.recompile_limit, 32)
    # Dynamo keeps one cache per code object and, on every call, evaluates the guards of its entries
    # newest first until one passes: with decode, verify-window and prefill graphs in one cache a
    # decode step paid for ~3 guard sets (~3,000 guards each: ~1 ms of a ~5 ms CPU step). So each
    # row class gets an entry function of its own (a fresh code object, made per model: no other
    # model's graphs can be found there either), and a step checks one guard set.
    param = next(model.parameters())
    dtype = param.dtype
    eager = model.forward
    # On the CPU the model's modules are not changed after this point and these code objects belong
    # to this model alone, so guards on module attributes (~3,000 per graph) only re-check what cannot
    # change: skipped (AUGURY_COMPILE_MODULE_GUARDS=1 keeps them). Guards on tensors and on the step's
    # metadata stay. fullgraph: a graph break would give the model's own forward a dynamo cache, keyed
    # on a code object every model of the class shares, where skipped guards would be unsafe. (GPU
    # steps mostly replay CUDA graphs, and not every GPU path is break-free: guards kept there.)
    skip = param.device.type == "cpu" and os.environ.get("AUGURY_COMPILE_MODULE_GUARDS") != "1"
    options = {"guard_filter_fn": torch.compiler.skip_guard_on_all_nn_modules_unsafe} if skip else {}
    compiled = {kind: torch.compile(_entry_function(f"augury_forward_{kind}"), dynamic=True, fullgraph=skip,
                                    options=options)
                for kind in ("one_row", "few_rows", "many_rows")}

    def forward(input_ids: torch.Tensor, positions: torch.Tensor, meta, kv, ropes: dict | None = None) -> torch.Tensor:
        if input_ids.device.type != "cpu":  # CPU graphs never read the masks (the op builds its own)
            prepare_masks(meta, dtype)
        n = input_ids.shape[0]
        kind = "one_row" if n == 1 else "few_rows" if n < _MANY_ROWS else "many_rows"
        return compiled[kind](eager, input_ids, positions, meta, kv, ropes)

    model.forward = forward


# From this many rows a step is a prefill chunk or a big batch (CPU int4 layers with a dense copy
# switch to it there: layers/quant_linear.py INT4_DENSE_MIN_ROWS)
_MANY_ROWS = 16


def _entry(fwd, input_ids, positions, meta, kv, ropes):  # noqa: ANN001 - traced by dynamo
    return fwd(input_ids, positions, meta, kv, ropes)


def _entry_function(name: str):
    """A function doing what `_entry` does, under a code object of its own (dynamo's cache key)."""
    import types

    return types.FunctionType(_entry.__code__.replace(co_name=name), _entry.__globals__, name)


def load_model(cfg: EngineConfig) -> LoadedModel:
    from augury.models.registry import build_model

    cfg.validate()
    device = pick_device(cfg.device)
    dtype = pick_dtype(cfg.dtype, device)
    if device.type == "cpu" and cfg.threads:
        torch.set_num_threads(cfg.threads)
    ckpt = load_checkpoint(cfg.model, progress=cfg.progress)
    mcfg = ModelConfig.from_hf_dict(ckpt.config)
    model = build_model(mcfg, device, dtype, max_positions=cfg.max_model_len)
    model.load_weights(ckpt.tensors())
    if cfg.weights != "native":
        from augury.weights.quantize import quantize_model

        quantize_model(model, cfg.weights)
        if cfg.weights == "int4" and device.type == "cpu":
            from augury.layers.quant_linear import dense_prefill_pays, keep_dense_copies

            # AMX, or no SIMD int4 kernel: dense copies for prefill; elsewhere the int4 kernel is faster
            kept = keep_dense_copies(model) if dense_prefill_pays() else 0
            if kept:
                log.info("int4: keeping %.0f MiB of dense weight copies for prefill", kept / 2**20)
    model.eval()
    maybe_compile(model, cfg)

    tf = ckpt.tokenizer_files
    if tf["kind"] == "hf_dir":
        tok = Tokenizer.from_hf_dir(tf["path"])
    else:
        tok = Tokenizer.from_gguf_metadata(tf["metadata"])

    eos: list[int] = []
    gen_eos = ckpt.generation_config.get("eos_token_id")
    if isinstance(gen_eos, int):
        gen_eos = [gen_eos]
    for i in list(mcfg.eos_token_ids) + list(gen_eos or []) + list(tok.eos_token_ids):
        if i is not None and i not in eos:
            eos.append(int(i))
    name = os.path.basename(str(cfg.model).rstrip("/")) if os.path.exists(str(cfg.model)) else str(cfg.model)
    return LoadedModel(name, model, mcfg, tok, device, dtype, ckpt.fingerprint, eos, ckpt.generation_config)
