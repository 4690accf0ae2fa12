"""QeRL norm noise: which weights, noise on a copy (trainer untouched, bitwise), fresh per step,
reproducible per (seed, step), loaded into an engine's model, and refused for engines that cannot."""

import pytest
import torch

from grpokit.broadcast.filesystem import FilesystemBroadcast
from grpokit.broadcast.vllm_nccl import VLLMNCCLBroadcast
from grpokit.common.noisy_norms import apply_norm_weights, check_engine_accepts_norms, noisy_norms, norm_weights
from grpokit.inference.builtin import BuiltinEngine
from grpokit.inference.vllm.engine import VLLMEngine
from grpokit.registry.noise.qerl import QeRL


def tiny_qwen3():
    from transformers import Qwen3Config, Qwen3ForCausalLM

    torch.manual_seed(0)
    config = Qwen3Config(
        vocab_size=128,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=2,
        num_key_value_heads=1,
        head_dim=32,
        max_position_embeddings=64,
    )
    return Qwen3ForCausalLM(config)


def test_norms_are_every_rmsnorm_by_base_model_name():
    names = set(norm_weights(tiny_qwen3()))
    per_layer = ["input_layernorm", "post_attention_layernorm", "self_attn.q_norm", "self_attn.k_norm"]
    assert names == {f"model.layers.{i}.{n}.weight" for i in range(2) for n in per_layer} | {"model.norm.weight"}


def test_peft_wrapper_is_looked_through():
    from peft import LoraConfig, get_peft_model

    plain = set(norm_weights(tiny_qwen3()))
    wrapped = get_peft_model(tiny_qwen3(), LoraConfig(r=4, target_modules=["q_proj"], task_type="CAUSAL_LM"))
    assert set(norm_weights(wrapped)) == plain


def test_noise_goes_to_a_copy_and_the_clean_weights_stay_bitwise():
    model = tiny_qwen3()
    with torch.no_grad():  # non-trivial clean values, so "copy of clean + noise" is checked, not "1 + noise"
        for w in norm_weights(model).values():
            w.uniform_(0.5, 1.5)
    before = {k: v.detach().clone() for k, v in model.state_dict().items()}
    noisy = noisy_norms(norm_weights(model), sigma=1e-2, seed=0, step=3)
    after = model.state_dict()
    assert all(torch.equal(before[k], after[k]) for k in before)
    clean = norm_weights(model)
    for name, w in noisy.items():
        assert w.data_ptr() != clean[name].data_ptr() and w.dtype == clean[name].dtype
    diff = torch.cat([(noisy[k] - clean[k].detach()).flatten() for k in noisy])
    assert diff.abs().max() > 0
    assert diff.std().item() == pytest.approx(1e-2, rel=0.15)  # 2*(2*64 + 2*32) + 64 = 448 draws
    assert abs(diff.mean().item()) < 3 * 1e-2 / 448**0.5 + 1e-4


def test_sigma_zero_returns_the_clean_values_exactly():
    model = tiny_qwen3()
    clean = norm_weights(model)
    assert all(torch.equal(v, clean[k]) for k, v in noisy_norms(clean, 0.0, seed=0, step=5).items())


def test_same_seed_and_step_reproduce_and_each_step_gets_fresh_noise():
    clean = norm_weights(tiny_qwen3())
    a, b = noisy_norms(clean, 1e-2, seed=7, step=4), noisy_norms(clean, 1e-2, seed=7, step=4)
    assert all(torch.equal(a[k], b[k]) for k in a)
    noise = lambda u: torch.cat([(u[k] - clean[k].detach()).flatten() for k in sorted(u)])  # noqa: E731
    z4, z5, z4_other_seed = (
        noise(a),
        noise(noisy_norms(clean, 1e-2, seed=7, step=5)),
        noise(noisy_norms(clean, 1e-2, seed=8, step=4)),
    )
    for other in (z5, z4_other_seed):
        assert not torch.equal(z4, other)
        assert abs(torch.corrcoef(torch.stack([z4, other]))[0, 1].item()) < 0.2  # independent draws, 448 each


def test_fresh_noise_each_qerl_stage_is_added_to_clean_not_accumulated():
    clean = norm_weights(tiny_qwen3())
    scheduler = QeRL()
    for step in (10, 20, 50):  # stages 1, 2, 5 of 100 steps
        sigma = scheduler.sigma(step, 100)
        diff = torch.cat([(v - clean[k].detach()).flatten() for k, v in noisy_norms(clean, sigma, 0, step).items()])
        assert diff.std().item() == pytest.approx(sigma, rel=0.15)


def test_apply_loads_into_the_engines_peft_model_in_place():
    from peft import LoraConfig, get_peft_model

    engine_model = get_peft_model(tiny_qwen3(), LoraConfig(r=4, target_modules=["q_proj"], task_type="CAUSAL_LM"))
    pointers = {k: v.data_ptr() for k, v in norm_weights(engine_model).items()}
    noisy = noisy_norms(norm_weights(tiny_qwen3()), 1e-2, seed=0, step=1)
    apply_norm_weights(engine_model, noisy)
    loaded = norm_weights(engine_model)
    assert all(torch.equal(loaded[k], noisy[k]) and loaded[k].data_ptr() == pointers[k] for k in noisy)
    with pytest.raises(ValueError, match="lacks"):
        apply_norm_weights(engine_model, {"model.layers.9.input_layernorm.weight": torch.ones(64)})


def test_vllm_is_refused_at_start_when_noise_is_on():
    check_engine_accepts_norms(BuiltinEngine(device="cpu"), QeRL())
    check_engine_accepts_norms(VLLMEngine(), None)
    check_engine_accepts_norms(VLLMEngine(), QeRL(enabled=False))
    with pytest.raises(ValueError, match="model.noise_scheduler .*VLLMEngine.*BuiltinEngine.*VLLMNCCLBroadcast"):
        check_engine_accepts_norms(VLLMEngine(), QeRL())
    with pytest.raises(ValueError, match="model.noise_scheduler"):  # LoRA hot reload from the filesystem broadcast
        check_engine_accepts_norms(VLLMEngine(), QeRL(), FilesystemBroadcast())


def test_vllm_is_accepted_when_its_worker_receives_the_weights():
    check_engine_accepts_norms(VLLMEngine(), QeRL(), VLLMNCCLBroadcast(backend="gloo"))  # the worker loads the norms
