"""data.expert: one gold completion per group, packed outside the loss mask; the trainer checks the loss uses it."""

import pytest
import torch

from grpokit.common.models import load_tokenizer
from grpokit.environments.environment import Environment, EnvSpec
from grpokit.loss import check_experts
from grpokit.orchestrator.experts import ExpertSettings, expert_rollouts
from grpokit.orchestrator.packing import pack
from grpokit.registry.losses.aipo import AIPO
from grpokit.registry.losses.chord import Chord
from grpokit.transport.codec import decode_batch, encode_batch
from grpokit.types import TrainingBatch
from tests.support import make_rollout


def sampled(env, example, group_id, prompt_ids, n=3, policy_step=4):
    return [
        make_rollout(
            [900 + i, 901],
            prompt_ids=prompt_ids,
            logprobs=[-1.0, -2.0],
            reward=0.5 * i,
            group_id=group_id,
            example_id=example.index,
            env_id=env.name,
            policy_step=policy_step - i,
        )
        for i in range(n)
    ]


@pytest.fixture(scope="module")
def setup(tiny_model):
    env = Environment(EnvSpec(id="reverse-text", args={"num_tasks": 5}))
    groups = [sampled(env, env.examples[3], 7, [1, 2, 3]), sampled(env, env.examples[1], 8, [4, 5])]
    return env, groups, load_tokenizer(tiny_model)


def test_one_expert_per_group_holds_the_reference_answer(setup):
    env, groups, tokenizer = setup
    experts = expert_rollouts(groups, [env], tokenizer, ExpertSettings())
    for expert, group in zip(experts, groups):
        answer = env.examples[group[0].example_id].task.data.answer
        assert expert.is_expert and expert.completion_text == answer
        assert expert.completion_ids == tokenizer.encode(answer, add_special_tokens=False) + [tokenizer.eos_token_id]
        assert tokenizer.decode(expert.completion_ids, skip_special_tokens=True) == answer
        assert (expert.prompt_ids, expert.group_id, expert.example_id, expert.policy_step) == (
            group[0].prompt_ids,
            group[0].group_id,
            group[0].example_id,
            2,
        )
    templated = expert_rollouts(groups[:1], [env], tokenizer, ExpertSettings(template="<answer>{answer}</answer>"))
    assert templated[0].completion_text == f"<answer>{env.examples[3].task.data.answer}</answer>"


def test_missing_field_names_the_recipe_key(setup):
    env, groups, tokenizer = setup
    with pytest.raises(ValueError, match="data.expert.field is 'solution'.*'reverse-text' example 3"):
        expert_rollouts(groups, [env], tokenizer, ExpertSettings(field="solution"))


def test_expert_tokens_are_packed_outside_the_loss_mask_and_survive_the_transport(setup):
    env, groups, tokenizer = setup
    rollouts = [r for g in groups for r in g]
    experts = expert_rollouts(groups, [env], tokenizer, ExpertSettings())
    advantages = [[1.0] * 2] * len(rollouts) + [[0.0] * len(e.completion_ids) for e in experts]
    [mb] = pack(rollouts + experts, advantages, [True] * len(rollouts + experts), seq_len=256)
    assert mb.loss_mask_T.sum() == 2 * len(rollouts)
    assert mb.expert_mask_T.sum() == sum(len(e.completion_ids) for e in experts)
    assert not torch.any((mb.loss_mask_T > 0) & (mb.expert_mask_T > 0))
    assert sorted(mb.input_ids_T[mb.expert_mask_T > 0].tolist()) == sorted(t for e in experts for t in e.completion_ids)
    batch = TrainingBatch(step=0, micro_batches=[mb])
    assert batch.num_expert_tokens == int(mb.expert_mask_T.sum()) and batch.num_loss_tokens == 2 * len(rollouts)
    assert torch.equal(decode_batch(encode_batch(batch)).micro_batches[0].expert_mask_T, mb.expert_mask_T)


def test_trainer_refuses_experts_the_loss_ignores_and_a_chord_batch_without_them(setup):
    env, groups, tokenizer = setup
    rollouts = [r for g in groups for r in g]
    experts = expert_rollouts(groups, [env], tokenizer, ExpertSettings())
    with_experts = TrainingBatch(
        step=0,
        micro_batches=pack(
            rollouts + experts,
            [[1.0] * 2] * len(rollouts) + [[0.0] * len(e.completion_ids) for e in experts],
            [True] * 8,
            256,
        ),
    )
    without = TrainingBatch(step=0, micro_batches=pack(rollouts, [[1.0] * 2] * len(rollouts), [True] * 6, 256))
    with pytest.raises(ValueError, match="model.loss AIPO does not train on them: use Chord, or remove data.expert"):
        check_experts(AIPO(), with_experts)
    with pytest.raises(
        ValueError, match="model.loss Chord trains on expert completions, and the batch has none: set data.expert"
    ):
        check_experts(Chord(), without)
    check_experts(Chord(), with_experts)
    check_experts(AIPO(), without)
    check_experts(Chord(), TrainingBatch(step=0, micro_batches=[]))  # an empty step (every group dropped) is fine
