"""model.teacher_model: the trainer scores each micro-batch under a frozen teacher for AIPO's teacher_tau."""

import pytest
import torch

from grpokit.common.logprobs import packed_token_logprobs
from grpokit.common.models import load_causal_lm, load_tokenizer
from grpokit.loss import LossInputs
from grpokit.main import main
from grpokit.orchestrator.packing import pack
from grpokit.registry.losses.aipo import AIPO
from grpokit.registry.losses.clipped_pg import ClippedPG
from grpokit.testing import tiny_fit_argv
from grpokit.trainer.policy import LoraSettings, Policy
from grpokit.types import TrainingBatch
from tests.support import make_rollout, read_metrics


@pytest.fixture(scope="module")
def teacher(tiny_model, tmp_path_factory) -> str:
    """The tiny model with its final norm scaled by 3: same tokenizer, sharper (different) predictions."""
    path = tmp_path_factory.mktemp("teacher")
    lm = load_causal_lm(tiny_model)
    with torch.no_grad():
        lm.model.norm.weight.mul_(3.0)
    lm.save_pretrained(path)
    load_tokenizer(tiny_model).save_pretrained(path)
    return str(path)


def rollout(prompt, completion):
    return make_rollout(completion, prompt_ids=prompt, logprobs=[-1.0] * len(completion))


def test_loss_inputs_carry_the_teacher_logprobs_of_each_packed_token(tiny_model, teacher):
    policy = Policy(model=tiny_model, lora=LoraSettings(rank=4), loss=AIPO(teacher_tau=1.0), teacher_model=teacher)
    policy.configure_model()
    rollouts = [rollout([5, 6, 7], [8, 9]), rollout([10, 11], [12, 13, 14])]
    [mb] = pack(rollouts, [[1.0] * 2, [-1.0] * 3], [True, True], seq_len=64)
    inputs: LossInputs = policy.loss_inputs(mb, TrainingBatch(step=0, micro_batches=[mb], temperature=0.7))
    expected_T = packed_token_logprobs(load_causal_lm(teacher), mb.input_ids_T, mb.position_ids_T, mb.seq_lens_N, 0.7)
    mask_T = mb.loss_mask_T > 0
    assert torch.allclose(inputs.teacher_logprobs_T[mask_T], expected_T[mask_T], atol=1e-6)
    assert inputs.teacher_logprobs_T[~mask_T].abs().max() == 0  # the head runs on the loss tokens only
    assert not inputs.teacher_logprobs_T.requires_grad
    assert not torch.allclose(inputs.teacher_logprobs_T[mask_T], inputs.trainer_logprobs_T.detach()[mask_T], atol=1e-3)
    assert all(not p.requires_grad for p in policy.teacher_lm.parameters())
    _, metrics = policy.loss(inputs)
    gap_T = (inputs.trainer_logprobs_T.detach() - inputs.teacher_logprobs_T)[mask_T]
    assert metrics["teacher_kl"].item() == pytest.approx(gap_T.mean().item(), abs=1e-6)


def test_teacher_and_loss_must_agree(tiny_model, teacher):
    with pytest.raises(ValueError, match="model.teacher_model is None but model.loss AIPO needs teacher logprobs"):
        Policy(model=tiny_model, loss=AIPO(teacher_tau=0.5))
    with pytest.raises(ValueError, match="model.loss ClippedPG does not use teacher logprobs"):
        Policy(model=tiny_model, loss=ClippedPG(), teacher_model=teacher)


def test_teacher_with_another_tokenizer_is_refused(tiny_model, tmp_path):
    tokenizer = load_tokenizer(tiny_model)
    tokenizer.add_tokens(["<another-vocabulary>"])
    load_causal_lm(tiny_model).save_pretrained(tmp_path)
    tokenizer.save_pretrained(tmp_path)
    policy = Policy(model=tiny_model, loss=AIPO(teacher_tau=1.0), teacher_model=str(tmp_path))
    policy.configure_model()
    [mb] = pack([rollout([5, 6], [7])], [[1.0]], [True], seq_len=16)
    with pytest.raises(ValueError, match="different tokenizer"):
        policy.loss_inputs(mb, TrainingBatch(step=0, micro_batches=[mb]))


def test_fit_distils_from_a_teacher(tiny_model, teacher, tmp_path):
    argv = tiny_fit_argv(
        tmp_path,
        tiny_model,
        "t",
        "--model.loss",
        "AIPO",
        "--model.loss.init_args.teacher_tau",
        "1.0",
        "--model.teacher_model",
        teacher,
        "--trainer.max_steps",
        "2",
        "--ckpt.interval",
        "0",
    )
    assert main(argv) == 0
    rows = read_metrics(tmp_path / "t")
    assert [int(r["step"]) for r in rows] == [0, 1]
    assert all(float(r["teacher_kl"]) != 0.0 and float(r["grad_norm"]) > 0 for r in rows)
