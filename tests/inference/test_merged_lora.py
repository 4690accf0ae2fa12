"""The plain sampler with the LoRA adapter merged (W + s * B @ A) computes what peft's unmerged adapter
computes, follows every adapter update, and never writes into the base weights (the trainer's own
frozen tensors in co-locate fit)."""

import pytest
import torch

from grpokit.common.logprobs import packed_token_logprobs
from grpokit.common.models import load_causal_lm
from grpokit.inference import SamplingSettings
from grpokit.inference.builtin import BuiltinEngine
from grpokit.inference.merged_lora import MergedLoRA, mergeable
from grpokit.trainer.metrics import mismatch_metrics
from grpokit.trainer.policy import LoraSettings, Policy

PROMPTS = [[1, 520, 9531, 198], [1, 4093, 198, 6004, 2, 198, 1, 520]]  # different lengths: left padding


def trainer(tiny_model, seed=0):
    p = Policy(
        model=tiny_model,
        lora=LoraSettings(
            rank=4, target_modules=["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
        ),
    )
    p.configure_model()
    randomize_adapter(p, seed)
    return p


def randomize_adapter(policy, seed):
    gen = torch.Generator().manual_seed(seed)
    for name, param in policy.lm.named_parameters():
        if "lora_B" in name:
            param.data.copy_(torch.randn(param.shape, generator=gen) * 0.5)  # an adapter that changes the outputs


def engine(tiny_model, merge_lora):
    e = BuiltinEngine(device="cpu", merge_lora=merge_lora)
    e.setup(tiny_model)
    return e


def logits(model, ids):
    with torch.no_grad():
        return model(input_ids=torch.tensor([ids])).logits.double()


def test_merged_sampling_equals_the_unmerged_adapter_across_updates(tiny_model):
    policy = trainer(tiny_model)
    merged, unmerged = engine(tiny_model, "auto"), engine(tiny_model, "off")
    ids = PROMPTS[1] + [33, 71, 9]
    for step in (1, 2):  # a second update: the merged weights follow the new adapter
        if step == 2:
            randomize_adapter(policy, seed=1)
        update = policy.weight_update(step)
        merged.load_weights(update)
        unmerged.load_weights(update)
        assert merged.merged is not None and unmerged.merged is None
        with merged.merged.active():
            inside = logits(merged.model, ids)
        reference = logits(unmerged.model, ids)
        assert torch.allclose(inside, reference, atol=1e-4), (inside - reference).abs().max()
        assert not torch.allclose(
            logits(load_causal_lm(tiny_model).eval(), ids), reference, atol=1e-2
        )  # the adapter matters
        assert torch.equal(logits(merged.model, ids), reference)  # outside active(): peft's unmerged model again
        assert merged.weights_sha256() == unmerged.weights_sha256()

        settings = SamplingSettings(temperature=0.0, max_tokens=10, seed=3)
        assert [[c.token_ids for c in g] for g in merged.generate(PROMPTS, 2, settings)] == [
            [c.token_ids for c in g] for g in unmerged.generate(PROMPTS, 2, settings)
        ]


def test_merged_engine_logprobs_match_the_trainers_unmerged_forward(tiny_model):
    policy = trainer(tiny_model)
    e = engine(tiny_model, "auto")
    e.load_weights(policy.weight_update(1))
    out = e.generate(PROMPTS, 3, SamplingSettings(temperature=0.8, max_tokens=12, seed=5))
    for prompt, group in zip(PROMPTS, out):
        for c in group:
            ids = prompt + c.token_ids
            with torch.no_grad():
                lp = packed_token_logprobs(
                    policy.lm, torch.tensor(ids), torch.arange(len(ids)), torch.tensor([len(ids)]), 0.8
                )
            mask = torch.tensor([0.0] * len(prompt) + [1.0] * len(c.token_ids))
            err = mismatch_metrics(lp, torch.tensor([0.0] * len(prompt) + c.logprobs), mask)["token_mult_prob_error"]
            assert float(err) < 1.0 + 1e-4


def test_sampling_never_writes_the_shared_base_weights(tiny_model):
    policy = trainer(tiny_model)
    frozen = {n: p.detach().clone() for n, p in policy.lm.named_parameters() if not p.requires_grad}
    e = engine(tiny_model, "auto")
    assert e.share_base_weights(policy.lm) > 0
    e.load_weights(policy.weight_update(1))
    e.generate(PROMPTS, 2, SamplingSettings(temperature=1.0, max_tokens=6, seed=0))
    for name, param in policy.lm.named_parameters():
        if not param.requires_grad:
            assert torch.equal(param, frozen[name]), name


def test_auto_keeps_peft_unmerged_where_a_merge_would_lose_precision_or_cannot_apply(tiny_model):
    assert BuiltinEngine(device="cpu", dtype="bfloat16")._merge is False  # bf16 would round s * B @ A away
    assert BuiltinEngine(device="cpu", fast="on")._merge is False  # graphs read the weights in place
    with pytest.raises(ValueError, match="merge_lora: on needs the plain path"):
        BuiltinEngine(device="cpu", fast="on", merge_lora="on")

    from peft import LoraConfig, get_peft_model

    dora = get_peft_model(load_causal_lm(tiny_model), LoraConfig(r=2, target_modules=["q_proj"], use_dora=True))
    assert not mergeable(dora)
    with pytest.raises(ValueError, match="set merge_lora: off"):
        MergedLoRA(dora)
