"""Process (step rewards normalised over the group) against float64 hand computations, and the step data path."""

import math

import pytest
import torch

from grpokit.common.models import load_tokenizer
from grpokit.environments.environment import Environment, EnvSpec
from grpokit.environments.steps import token_step_ends
from grpokit.registry.advantages.group_norm import GroupNorm
from grpokit.registry.advantages.process import Process
from grpokit.testing import check_component
from tests.support import make_rollout

R2 = math.sqrt(2)


def rollout(num_tokens, step_rewards, step_ends, env_id="e"):
    return make_rollout([7] * num_tokens, env_id=env_id, step_rewards=step_rewards, step_ends=step_ends)


def test_hand_computed_two_groups():
    # group 0: R = {1, 0, 1}, mean 2/3, population std sqrt(2)/3: 1 -> 1/sqrt(2), 0 -> -sqrt(2).
    #   A (5 tokens): steps end at tokens 1 (r 1) and 3 (r 0); token 4 is after the last step.
    #   B (3 tokens): one step ending at token 2 (r 1).
    # group 1: R = {0, 1}: -1, +1. C reports no steps; D's steps end at tokens 0 (r 0) and 1 (r 1).
    groups = [
        [rollout(5, [1.0, 0.0], [1, 3]), rollout(3, [1.0], [2])],
        [rollout(3, [], []), rollout(2, [0.0, 1.0], [0, 1])],
    ]
    a, b, c, d = Process(eps=0.0).token_advantages(groups)
    assert a == pytest.approx([1 / R2 - R2, 1 / R2 - R2, -R2, -R2, 0.0], abs=1e-12)
    assert b == pytest.approx([1 / R2] * 3, abs=1e-12)
    assert c == [0.0, 0.0, 0.0]
    assert d == pytest.approx([0.0, 1.0], abs=1e-12)


def test_group_step_rewards_are_normalised_to_zero_mean_unit_std():
    steps = [([0.2, 0.9, 0.4], [0, 2, 5]), ([1.0], [3]), ([0.0, 0.3], [1, 4])]
    group = [rollout(6, r, e) for r, e in steps]
    first = [adv[0] for adv in Process(eps=0.0).token_advantages([group])]  # token 0 sums all of a rollout's steps
    all_R = torch.tensor([r for rs, _ in steps for r in rs], dtype=torch.float64)
    normalized = (all_R - all_R.mean()) / all_R.std(correction=0)
    assert first == pytest.approx(
        [normalized[:3].sum().item(), normalized[3].item(), normalized[4:].sum().item()], abs=1e-12
    )
    assert sum(first) == pytest.approx(0.0, abs=1e-12)  # one start token per rollout: the normalised rewards sum to 0


def test_equal_step_rewards_give_exactly_zero():
    group = [rollout(4, [0.1, 0.1], [0, 3]), rollout(2, [0.1], [1]), rollout(3, [], [])]
    assert Process().token_advantages([group]) == [[0.0] * 4, [0.0] * 2, [0.0] * 3]


def test_a_rollout_without_step_rewards_names_its_environment():
    group = [
        rollout(2, [1.0], [1]),
        make_rollout([7], reward=1.0, example_id=3, env_id="countdown"),
    ]
    with pytest.raises(
        ValueError, match=r"environment 'countdown' reports none: give its task a step_rewards\(reply\)"
    ):
        Process().token_advantages([group])


def test_outcome_rewards_alone_are_the_group_norm_advantage():
    rewards = torch.tensor([[0.0, 1.0, 0.5, 0.25], [2.0, 2.0, 2.0, 2.0]], dtype=torch.float64)
    lengths = torch.ones_like(rewards)
    torch.testing.assert_close(Process()(rewards, lengths), GroupNorm()(rewards, lengths), rtol=0, atol=1e-12)
    check_component(Process)


def test_rollout_step_fields_are_checked():
    with pytest.raises(ValueError, match="same length"):
        rollout(3, [1.0, 0.0], [2])
    with pytest.raises(ValueError, match="must ascend and index completion_ids"):
        rollout(3, [1.0], [3])


def test_token_step_ends_binary_search_on_decoded_prefixes():
    pieces = ["ab", " c", "de", " f"]  # decodes to "ab cde f"; prefix lengths 2, 4, 6, 8
    decode = lambda ids: "".join(pieces[i] for i in ids)  # noqa: E731
    assert token_step_ends(decode, [0, 1, 2, 3], [2, 3, 6, 8]) == [0, 1, 2, 3]
    assert token_step_ends(decode, [0, 1, 2, 3], [5]) == [2]


def test_reverse_text_words_are_steps_on_the_real_tokenizer(tiny_model):
    tokenizer = load_tokenizer(tiny_model)
    env = Environment(EnvSpec(id="reverse-text", args={"num_tasks": 4, "min_words": 2, "max_words": 2}))
    example = env.examples[0]
    first, second = example.task.data.answer.split()
    ids = tokenizer.encode(f"{first} {second[:-1]}x", add_special_tokens=False) + [tokenizer.eos_token_id]
    reply = tokenizer.decode(ids, skip_special_tokens=True)
    [steps] = env.step_rewards([example], [reply])
    assert [r for _, r in steps] == pytest.approx([1.0, (2 * (len(second) - 1)) / (2 * len(second))])
    decode = lambda t: tokenizer.decode(t, skip_special_tokens=True)  # noqa: E731
    ends = token_step_ends(decode, ids, [e for e, _ in steps])
    for (end, _), token in zip(steps, ends):  # the step's last token is the first whose prefix covers the step
        assert len(decode(ids[: token + 1])) >= end > len(decode(ids[:token]))
    assert ends[-1] < len(ids) - 1  # the EOS token after the last word belongs to no step
