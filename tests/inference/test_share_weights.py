"""Co-locate with LoRA: the builtin engine samples with the trainer's frozen base weights (one copy in
memory), keeps its own RMSNorm weights (QeRL writes noisy ones into them), shares nothing under full
fine-tuning, and computes exactly what it computed with its own copy."""

import torch

from grpokit.common.noisy_norms import norm_weights
from grpokit.inference.builtin import BuiltinEngine
from grpokit.registry.noise.qerl import QeRL
from grpokit.trainer.policy import LoraSettings, Policy


def policy(tiny_model, lora):
    p = Policy(model=tiny_model, lora=lora, noise_scheduler=QeRL())
    torch.manual_seed(0)
    p.configure_model()
    for name, param in p.lm.named_parameters():
        if "lora_B" in name:
            param.data.normal_()  # an adapter that changes the outputs
    return p


def engine(tiny_model):
    e = BuiltinEngine(device="cpu")
    e.setup(tiny_model)
    return e


def logits(model, ids):
    with torch.no_grad():
        return model(input_ids=ids).logits


def test_engine_shares_the_trainers_frozen_base_weights_and_computes_the_same(tiny_model):
    trainer = policy(tiny_model, LoraSettings(rank=4, target_modules=["q_proj", "v_proj", "gate_proj"]))
    own, shared = engine(tiny_model), engine(tiny_model)
    update = trainer.weight_update(1)
    trainer_base = {
        n.removeprefix("base_model.model.").replace(".base_layer.", "."): p
        for n, p in trainer.lm.named_parameters()
        if not p.requires_grad
    }
    norms = set(norm_weights(shared.model))

    expected = sum(
        p.numel() * p.element_size() for n, p in shared.model.named_parameters() if n not in norms
    )  # tied head counted once
    assert shared.share_base_weights(trainer.lm) == expected > 0
    for name, param in shared.model.named_parameters():
        same = param.data_ptr() == trainer_base[name].data_ptr()
        assert same == (name not in norms), name  # everything but the norms is the trainer's tensor

    for e in (own, shared):  # the adapter and QeRL's noisy norms of step 1, into each engine
        e.load_weights(update)
    assert update.norm_tensors and all(
        not torch.equal(trainer_base[n], v) for n, v in update.norm_tensors.items()
    )  # the trainer's norms stay clean
    ids = torch.tensor([[1, 520, 9531, 198, 33, 71]])
    assert torch.equal(logits(own.model, ids), logits(shared.model, ids))  # same numbers as with its own copy
    assert shared.weights_sha256() == own.weights_sha256()


def test_nothing_is_shared_under_full_fine_tuning(tiny_model):
    trainer, e = policy(tiny_model, None), engine(tiny_model)
    before = {n: p.data_ptr() for n, p in e.model.named_parameters()}
    assert (
        e.share_base_weights(trainer.lm) == 0
    )  # every trainer weight trains: the engine keeps the step it samples with
    assert {n: p.data_ptr() for n, p in e.model.named_parameters()} == before
