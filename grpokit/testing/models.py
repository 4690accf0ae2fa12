"""The tests' tiny random model and the CLI arguments of a short run on it."""

from __future__ import annotations

import torch


def build_tiny_model(path, seed: int = 0):
    """The tests' tiny model, saved to `path` (returned): a random 2-layer, hidden-64 Llama (head_dim 32,
    one key-value head) with SmolLM2's tokenizer, so that tests and benches run real code in seconds."""
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


def tiny_fit_argv(output_dir, model: str, run_name: str, *overrides: str, command: str = "fit") -> list[str]:
    """CLI arguments for a short run of the shipped reverse-text recipe on a small (test) model: LoRA
    rank 4, 2 prompts x 4 rollouts of <= 8 tokens per step, no filters, no progress bar. `overrides`
    come last, so they win over these values."""
    from importlib.resources import files

    recipe = files("grpokit.recipes") / "reverse_text.yaml"
    return [
        command,
        "--config",
        str(recipe),
        "--output_dir",
        str(output_dir),
        "--run_name",
        run_name,
        "--model.model",
        model,
        "--model.lora.rank",
        "4",
        "--data.batch_size",
        "8",
        "--data.rollouts_per_example",
        "4",
        "--data.sampling.max_tokens",
        "8",
        "--data.seq_len",
        "128",
        "--data.filters",
        "[]",
        "--trainer.enable_progress_bar",
        "false",
        *overrides,
    ]
