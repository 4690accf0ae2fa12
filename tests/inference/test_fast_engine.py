"""The fast engine path (static cache, continuous batching) against the plain sampler and a plain forward.

On CPU the runner runs without CUDA graphs; the same step code is what the graphs capture on GPU
(bench/gpu_bench.sh checks the graph path there).
"""

from __future__ import annotations

import pytest
import torch

from grpokit.inference import SamplingSettings
from grpokit.inference.builtin import BuiltinEngine
from grpokit.inference.fast.runner import ModelRunner
from grpokit.types import WeightUpdate
from tests.support import tiny_lora_update

PROMPTS = [[1, 17, 230, 99], [5, 6], [300, 301, 302, 303, 304, 305, 306], [42]]


def engines(model: str, **kw) -> tuple[BuiltinEngine, BuiltinEngine]:
    plain, fast = BuiltinEngine(device="cpu", fast="off", **kw), BuiltinEngine(device="cpu", fast="on", **kw)
    plain.setup(model)
    fast.setup(model)
    return plain, fast


def assert_same_greedy(plain: BuiltinEngine, fast: BuiltinEngine, prompts=PROMPTS, max_tokens: int = 12) -> None:
    sampling = SamplingSettings(temperature=0.0, max_tokens=max_tokens)
    want, got = plain.generate(prompts, 2, sampling), fast.generate(prompts, 2, sampling)
    for group_w, group_g in zip(want, got):
        for w, g in zip(group_w, group_g):
            assert g.token_ids == w.token_ids
            assert g.is_truncated == w.is_truncated
            torch.testing.assert_close(torch.tensor(g.logprobs), torch.tensor(w.logprobs), atol=1e-4, rtol=0)


def test_greedy_tokens_and_logprobs_match_the_plain_sampler_with_refilled_slots(tiny_model):
    # 8 requests through 3 slots: slots are refilled from the queue as sequences finish
    plain, fast = engines(tiny_model, max_batch_size=3)
    assert_same_greedy(plain, fast)
    assert fast.runner.num_slots == 3


def test_sampled_logprobs_match_a_plain_forward(tiny_model):
    _, fast = engines(tiny_model, max_batch_size=4)
    groups = fast.generate(PROMPTS, 3, SamplingSettings(temperature=0.7, max_tokens=10, seed=3))
    model = fast.model
    for prompt, group in zip(PROMPTS, groups):
        for c in group:
            ids = torch.tensor([prompt + c.token_ids])
            with torch.no_grad():
                logits = model(input_ids=ids).logits[0, len(prompt) - 1 : -1].float() / 0.7
            want = torch.log_softmax(logits, -1).gather(-1, ids[0, len(prompt) :, None]).squeeze(-1)
            torch.testing.assert_close(torch.tensor(c.logprobs), want, atol=1e-4, rtol=0)


def test_same_seed_same_samples(tiny_model):
    _, fast = engines(tiny_model, max_batch_size=4)
    sampling = SamplingSettings(temperature=1.0, max_tokens=8, seed=11)
    a, b = fast.generate(PROMPTS, 2, sampling), fast.generate(PROMPTS, 2, sampling)
    assert [[c.token_ids for c in g] for g in a] == [[c.token_ids for c in g] for g in b]


def test_qwen3_shape_with_qk_norm_and_gqa(tmp_path):
    from transformers import Qwen3Config, Qwen3ForCausalLM

    torch.manual_seed(0)
    config = Qwen3Config(
        vocab_size=512,
        hidden_size=64,
        intermediate_size=96,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=16,
        max_position_embeddings=256,
        tie_word_embeddings=True,
        eos_token_id=2,
        pad_token_id=0,
    )
    model = Qwen3ForCausalLM(config).eval()
    runner = ModelRunner(model, num_slots=2, max_len=64, use_cuda_graphs=False)
    prompt = [3, 9, 27, 81, 243]
    logits = runner.prefill([prompt, prompt[:2]], [0, 1])
    with torch.no_grad():
        want = model(input_ids=torch.tensor([prompt])).logits[0, -1]
        want_short = model(input_ids=torch.tensor([prompt[:2]])).logits[0, -1]
    torch.testing.assert_close(logits[0], want, atol=1e-4, rtol=1e-4)
    torch.testing.assert_close(logits[1], want_short, atol=1e-4, rtol=1e-4)
    # decode one token in each slot at different positions
    step = runner.decode([7, 8], [5, 2])
    with torch.no_grad():
        want = model(input_ids=torch.tensor([prompt + [7]])).logits[0, -1]
        want_short = model(input_ids=torch.tensor([prompt[:2] + [8]])).logits[0, -1]
    torch.testing.assert_close(step[0], want, atol=1e-4, rtol=1e-4)
    torch.testing.assert_close(step[1], want_short, atol=1e-4, rtol=1e-4)


def test_lora_update_applies_on_the_fast_path(tiny_model):
    plain, fast = engines(tiny_model, max_batch_size=4)
    fast.generate(PROMPTS[:1], 1, SamplingSettings(temperature=0.0, max_tokens=2))  # runner built before the adapter
    for engine in (plain, fast):
        engine.load_weights(tiny_lora_update(step=1))
    assert_same_greedy(plain, fast)
    before = fast.generate(PROMPTS, 1, SamplingSettings(temperature=0.0, max_tokens=6))
    for engine in (plain, fast):  # second update: values change in place
        engine.load_weights(tiny_lora_update(step=2, scale=2.0))
    assert_same_greedy(plain, fast)
    after = fast.generate(PROMPTS, 1, SamplingSettings(temperature=0.0, max_tokens=6))
    assert after[0][0].policy_step == 2
    assert [c.logprobs for g in before for c in g] != [c.logprobs for g in after for c in g]


def test_unsupported_architecture_names_the_fix():
    from transformers import GPT2Config, GPT2LMHeadModel

    model = GPT2LMHeadModel(GPT2Config(n_layer=1, n_embd=32, n_head=2, vocab_size=64))
    with pytest.raises(ValueError, match="fast: off"):
        ModelRunner(model, num_slots=1, max_len=32, use_cuda_graphs=False)


def test_min_tokens_repetition_penalty_and_stop_strings_match_the_plain_sampler(tiny_model):
    plain, fast = engines(tiny_model, max_batch_size=3)
    for sampling in (
        SamplingSettings(temperature=0.0, max_tokens=12, min_tokens=6, repetition_penalty=1.3),
        SamplingSettings(temperature=0.0, max_tokens=16, stop=["e"]),
        SamplingSettings(temperature=0.0, max_tokens=16, stop=["e"], min_tokens=4),
    ):
        want, got = plain.generate(PROMPTS, 1, sampling), fast.generate(PROMPTS, 1, sampling)
        assert [c.token_ids for g in got for c in g] == [c.token_ids for g in want for c in g]
        assert [c.is_truncated for g in got for c in g] == [c.is_truncated for g in want for c in g]
        for g_w, g_g in zip(want, got):
            torch.testing.assert_close(torch.tensor(g_g[0].logprobs), torch.tensor(g_w[0].logprobs), atol=1e-4, rtol=0)
    stopped = fast.generate(PROMPTS, 1, SamplingSettings(temperature=0.0, max_tokens=16, stop=["e"]))
    assert any(not g[0].is_truncated and "e" in fast.tokenizer.decode(g[0].token_ids) for g in stopped)


def test_gumbel_sampler_draws_from_the_tempered_softmax():
    from grpokit.inference.fast.sampling import sample_tokens

    logits_V = torch.tensor([2.0, 1.0, 0.0, -1.0, 0.5])
    probs_V = torch.softmax(logits_V / 0.8, -1)
    token_N, logprob_N = sample_tokens(logits_V.repeat(40000, 1), 0.8, 1.0, torch.Generator().manual_seed(0))
    freq_V = torch.bincount(token_N, minlength=5).float() / 40000
    assert (freq_V - probs_V).abs().max() < 0.01  # ~4 standard errors at these counts
    torch.testing.assert_close(logprob_N, probs_V.log()[token_N])


def test_a_full_weight_update_reaches_every_runner_of_the_model(tiny_model):
    # A stream's runner and the generate path's (eval) runner on one model at once: both fuse q/k/v and
    # gate/up into one tensor each, and a full-weight update (copied into the modules' weights) must
    # reach the tensors both of them read, not only the last one fused.
    _, fast = engines(tiny_model)
    model, prompt = fast.model, [1, 17, 230, 99]
    runners = [ModelRunner(model, 2, 64, use_cuda_graphs=False) for _ in range(2)]
    assert runners[0].fused[0] is not None  # plain Linear projections: fused
    g = torch.Generator().manual_seed(0)
    new = {
        k: v + 0.05 * torch.randn(v.shape, generator=g) for k, v in model.state_dict().items() if v.is_floating_point()
    }
    fast.load_weights(WeightUpdate(step=1, tensors=new))
    with torch.no_grad():
        want = model(input_ids=torch.tensor([prompt + [7]])).logits[0, -1]
    for runner in runners:
        runner.prefill([prompt], [0])
        torch.testing.assert_close(runner.decode([7], [len(prompt)])[0], want, atol=1e-4, rtol=0)


@pytest.mark.unit
def test_a_kv_cache_larger_than_the_free_gpu_memory_names_rows_length_and_the_fix(monkeypatch):
    from grpokit.inference.fast import runner

    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda device=None: (2**30, 2**31))  # 1 GiB free
    shape = (28, 128, 8, 40960, 128)  # Qwen3-0.6B, 128 rows of its full 40,960-token context
    with pytest.raises(ValueError, match=r"128 rows of 40960 tokens needs 560\.0 GiB.*1\.0 GiB free.*max_len"):
        runner._check_kv_fits(shape, torch.bfloat16, torch.device("cuda"))
    runner._check_kv_fits((28, 8, 8, 512, 128), torch.bfloat16, torch.device("cuda"))  # 0.1 GiB fits
    runner._check_kv_fits(shape, torch.bfloat16, torch.device("cpu"))  # host memory: not checked
