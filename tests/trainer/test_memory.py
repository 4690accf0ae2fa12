"""grpokit.inference.vllm.memory: the trainer's memory estimate, term by term against a hand computation, and the share
of the GPU it leaves a co-located vLLM server."""

import pytest

from grpokit.inference.vllm.memory import (
    GIB,
    ModelShape,
    colocated_gpu_memory_utilization,
    model_shape,
    policy_trainer_bytes,
    trainer_bytes,
)


def test_model_shape_of_the_tiny_llama(tiny_model):
    # hidden 64, intermediate 128, 2 layers, 2 heads of 32, 1 KV head, tied embeddings, vocab V
    shape = model_shape(tiny_model, lora_rank=4, target_modules=["q_proj", "k_proj", "v_proj", "o_proj"])
    v = shape.vocab
    per_layer = 64 * 64 + 64 * 32 + 64 * 32 + 64 * 64 + 3 * 64 * 128 + 2 * 64  # q k v o, gate up down, 2 norms
    assert shape.params == v * 64 + 2 * per_layer + 64  # embeddings (tied lm_head), layers, final norm
    assert (shape.layers, shape.hidden) == (2, 64)
    assert shape.lora_params == 2 * 4 * ((64 + 64) + (64 + 32) + (64 + 32) + (64 + 64))  # r * (in + out) per module
    assert model_shape(tiny_model).lora_params == 0


def test_lora_terms_by_hand():
    shape = ModelShape(params=1_000_000, layers=4, hidden=256, vocab=1000, lora_params=10_000)
    terms = trainer_bytes(shape, tokens=512, dtype_bytes=2, lora=True)
    assert terms["weights"] == 1_000_000 * 2
    assert terms["trainable"] == 10_000 * 4 and terms["gradients"] == 10_000 * 4 and terms["optimizer"] == 10_000 * 8
    assert terms["activations"] == 512 * 4 * 256 * 17 * 2
    assert terms["logits"] == 512 * 1000 * 4 * 2  # not chunked: every token's float32 logits and gradient
    assert terms["overhead"] == 2 * GIB
    assert terms["total"] == sum(v for k, v in terms.items() if k != "total")


def test_full_fine_tuning_checkpointing_chunking_8bit_and_reference_by_hand():
    shape = ModelShape(params=1_000_000, layers=4, hidden=256, vocab=1000)
    terms = trainer_bytes(
        shape,
        tokens=512,
        dtype_bytes=2,
        lora=False,
        optimizer="adamw_8bit",
        gradient_checkpointing=True,
        logprob_chunk_size=128,
        reference_copy=True,
    )
    assert terms["weights"] == 2 * 1_000_000 * 2  # the trained weights and the frozen reference copy
    assert terms["trainable"] == 0  # counted in weights
    assert terms["gradients"] == 1_000_000 * 2 and terms["optimizer"] == 1_000_000 * 2
    assert terms["activations"] == 512 * 4 * 256 * 2 + 512 * 256 * 17 * 2  # layer inputs + one layer recomputed
    assert terms["logits"] == 128 * 1000 * 4 * 2


def test_colocated_share_leaves_a_margin_and_refuses_a_full_gpu():
    assert colocated_gpu_memory_utilization(20 * GIB, 80 * GIB) == pytest.approx(0.75 - 0.05)
    with pytest.raises(ValueError, match="set inference.init_args.serve.gpu_memory_utilization"):
        colocated_gpu_memory_utilization(75 * GIB, 80 * GIB)


def test_policy_estimate_reads_the_recipe(tiny_model):
    from grpokit.trainer.policy import LoraSettings, Policy

    policy = Policy(model=tiny_model, lora=LoraSettings(rank=4), dtype="bfloat16", logprob_chunk_size=64)
    terms = policy_trainer_bytes(policy, seq_len=256)
    shape = model_shape(tiny_model, 4, LoraSettings().target_modules)
    assert terms == trainer_bytes(shape, tokens=256, dtype_bytes=2, lora=True, logprob_chunk_size=64)
