"""Models for benchmarks: config shapes with random weights (no hub needed) or a real model by name."""

from __future__ import annotations

import contextlib
import tempfile
from collections.abc import Iterator

import torch

from grpokit.common.models import load_causal_lm

SHAPES = {
    # Qwen3-0.6B's published config (hidden 1024, 28 layers, 16 q heads / 8 kv heads of 128, vocab 151936)
    "qwen3-0.6b": dict(
        arch="qwen3",
        vocab_size=151936,
        hidden_size=1024,
        intermediate_size=3072,
        num_hidden_layers=28,
        num_attention_heads=16,
        num_key_value_heads=8,
        head_dim=128,
        max_position_embeddings=40960,
        rope_theta=1000000.0,
        rms_norm_eps=1e-6,
        tie_word_embeddings=True,
    ),
    # SmolLM2-135M's config, random weights (the real one: --model smollm2-135m)
    "smollm2-135m-shape": dict(
        arch="llama",
        vocab_size=49152,
        hidden_size=576,
        intermediate_size=1536,
        num_hidden_layers=30,
        num_attention_heads=9,
        num_key_value_heads=3,
        head_dim=64,
        max_position_embeddings=8192,
        rope_theta=100000.0,
        rms_norm_eps=1e-5,
        tie_word_embeddings=True,
    ),
    "tiny": dict(
        arch="llama",
        vocab_size=512,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=2,
        num_key_value_heads=1,
        head_dim=32,
        max_position_embeddings=1024,
        tie_word_embeddings=True,
    ),
}


def build_model(name: str, dtype: torch.dtype, device: str) -> torch.nn.Module:
    """A causal LM in eval mode on `device`: a shape from SHAPES (random init, seed 0) or a model name."""
    torch.manual_seed(0)
    if name not in SHAPES:
        return load_causal_lm(name, dtype=dtype).to(device).eval()
    from transformers import LlamaConfig, LlamaForCausalLM, Qwen3Config, Qwen3ForCausalLM

    spec = dict(SHAPES[name])
    config_cls, model_cls = {"qwen3": (Qwen3Config, Qwen3ForCausalLM), "llama": (LlamaConfig, LlamaForCausalLM)}[
        spec.pop("arch")
    ]
    config = config_cls(**spec, eos_token_id=None, bos_token_id=None, pad_token_id=None)
    with torch.device(device):
        model = model_cls(config).to(dtype)
    return model.eval()


@contextlib.contextmanager
def model_folder(name: str, dtype: torch.dtype, device: str) -> Iterator[str]:
    """What grpokit.trainer.policy.Policy(model=...) loads for `name`: the name itself, or for a shape a temporary
    folder holding build_model(name, dtype, device)'s random weights (the same weights the naive paths get)."""
    if name not in SHAPES:
        yield name
        return
    with tempfile.TemporaryDirectory(prefix=f"grpokit-bench-{name}-") as folder:
        build_model(name, dtype, device).save_pretrained(folder)
        yield folder


def weight_bytes(model: torch.nn.Module) -> int:
    """Bytes of distinct parameter storage (tied embeddings counted once)."""
    seen, total = set(), 0
    for p in model.parameters():
        if p.data_ptr() not in seen:
            seen.add(p.data_ptr())
            total += p.numel() * p.element_size()
    return total


def kv_bytes_per_token(model: torch.nn.Module) -> int:
    config = model.config
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
    kv_heads = getattr(config, "num_key_value_heads", None) or config.num_attention_heads
    return 2 * config.num_hidden_layers * kv_heads * head_dim * next(model.parameters()).element_size()


def measured_bandwidth(device: str) -> float:
    """Device memory bandwidth in bytes/s from a 1 GiB device-to-device copy (bytes read + written)."""
    if not device.startswith("cuda"):
        n = 1 << 26
        a = torch.empty(n, dtype=torch.float32)
        b = torch.empty_like(a)
        b.copy_(a)
        import time

        t = time.perf_counter()
        for _ in range(5):
            b.copy_(a)
        return 2 * a.numel() * 4 * 5 / (time.perf_counter() - t)
    a = torch.empty(1 << 28, dtype=torch.float32, device=device)
    b = torch.empty_like(a)
    b.copy_(a)
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(10):
        b.copy_(a)
    end.record()
    torch.cuda.synchronize()
    return 2 * a.numel() * 4 * 10 / (start.elapsed_time(end) / 1e3)


class NoText:
    """The tokenizer of a shape (random weights, no vocabulary file): decodes nothing, pads with 0."""

    pad_token_id, eos_token_id = 0, 2

    def decode(self, ids, skip_special_tokens: bool = False) -> str:
        return ""


def shape_engine(name: str, dtype: torch.dtype, device: str, **engine_kwargs):
    """A BuiltinEngine around build_model(name)'s random weights (no stop strings; EOS id 2)."""
    from grpokit.inference.builtin import BuiltinEngine

    engine = BuiltinEngine(dtype=str(dtype).removeprefix("torch."), device=device, **engine_kwargs)
    engine.model, engine.tokenizer = build_model(name, dtype, device), NoText()
    engine.max_model_len = engine.model.config.max_position_embeddings
    engine.stop_token_ids, engine.weight_step = {2}, 0
    engine.vocab_size = engine.model.get_output_embeddings().weight.shape[0]
    return engine
