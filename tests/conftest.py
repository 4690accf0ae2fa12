"""Shared fixtures: a tiny random Llama with the SmolLM2 tokenizer, built once per test session."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch

REPO = Path(__file__).resolve().parents[1]


def build_tiny_model(path: Path, seed: int = 0) -> Path:
    """A 2-layer, hidden-64 Llama (head_dim 32) with SmolLM2's tokenizer, saved to `path`."""
    from transformers import LlamaConfig, LlamaForCausalLM

    from grpokit.common.models import load_tokenizer

    tokenizer = load_tokenizer("smollm2-135m")
    torch.manual_seed(seed)
    config = LlamaConfig(
        vocab_size=len(tokenizer),
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=2,
        num_key_value_heads=1,
        head_dim=32,
        max_position_embeddings=512,
        tie_word_embeddings=True,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
    )
    LlamaForCausalLM(config).save_pretrained(path)
    tokenizer.save_pretrained(path)
    return path


@pytest.fixture(scope="session")
def tiny_model(tmp_path_factory) -> str:
    return str(build_tiny_model(tmp_path_factory.mktemp("tiny-llama")))


@pytest.fixture(scope="session", autouse=True)
def _discover_components():
    from grpokit.cli.discovery import discover

    discover()
    torch.set_num_threads(min(2, os.cpu_count() or 1))
