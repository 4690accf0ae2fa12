"""data.kl_in_reward: reward - coef * KL_seq for the advantages (grpokit/orchestrator/kl_reward.py).

Hand-computed shaping and advantages in float64; the reference scorer against a plain unpacked forward
of a tiny random model; a tiny `grpokit fit` whose step-0 KL is ~0 and whose reference stays frozen.
"""

from __future__ import annotations

import logging
import math

import pytest
import torch

from grpokit.main import main
from grpokit.orchestrator import Orchestrator
from grpokit.orchestrator.kl_reward import (
    KLInReward,
    KLInRewardSettings,
    ReferenceScorer,
    sequence_kl,
    shaped_groups,
    warn_if_loss_has_kl,
)
from grpokit.registry.advantages.group_norm import GroupNorm
from grpokit.registry.advantages.process import Process
from grpokit.registry.losses.aipo import AIPO
from grpokit.registry.losses.clipped_pg import ClippedPG
from grpokit.testing import tiny_fit_argv
from tests.support import make_rollout, read_metrics


def rollout(reward, logprobs, mask=None, prompt=(1, 2, 3), completion=None, group=0):
    completion = completion if completion is not None else [10 + i for i in range(len(logprobs))]
    return make_rollout(completion, prompt_ids=prompt, logprobs=logprobs, mask=mask, reward=reward, group_id=group)


# 2 groups x 2 rollouts: engine (behaviour) logprobs logp, reference logprobs logq; the third token of
# rollout 0 is the environment's (mask 0), so its huge log-ratio must not count
GROUPS = [
    [rollout(1.0, [-0.5, -1.0, -9.0], [1, 1, 0]), rollout(0.0, [-2.0, -0.1])],
    [rollout(0.5, [-1.0]), rollout(0.5, [-0.3, -0.3])],
]
REF = [[-0.7, -0.8, -0.01], [-1.5, -0.1], [-1.2], [-0.3, -0.6]]


def by_hand(estimator):
    """KL_seq per rollout, in the groups' flattened order, written out token by token."""

    def k(p, q):
        return p - q if estimator == "k1" else math.exp(q - p) - (q - p) - 1

    return [
        k(-0.5, -0.7) + k(-1.0, -0.8),  # the masked third token left out
        k(-2.0, -1.5) + k(-0.1, -0.1),
        k(-1.0, -1.2),
        k(-0.3, -0.3) + k(-0.3, -0.6),
    ]


@pytest.mark.unit
@pytest.mark.parametrize("estimator", ["k1", "k3"])
def test_shaped_rewards_and_group_norm_advantages_by_hand(estimator):
    ref = [torch.tensor(q, dtype=torch.float64) for q in REF]
    flat = [r for g in GROUPS for r in g]
    kl = sequence_kl(flat, ref, estimator)
    expected_kl = by_hand(estimator)
    torch.testing.assert_close(kl, torch.tensor(expected_kl, dtype=torch.float64), rtol=0, atol=1e-12)
    if estimator == "k1":  # k1 written out once more as plain numbers
        torch.testing.assert_close(kl, torch.tensor([0.0, -0.5, 0.2, 0.3], dtype=torch.float64), rtol=0, atol=1e-12)

    shaped = shaped_groups(GROUPS, kl, coef=0.1)
    rewards = [[1.0, 0.0], [0.5, 0.5]]
    want = [[rewards[p][i] - 0.1 * expected_kl[2 * p + i] for i in range(2)] for p in range(2)]
    assert [r.reward for g in shaped for r in g] == pytest.approx([w for g in want for w in g], abs=1e-12)
    if estimator == "k1":
        assert [r.reward for g in shaped for r in g] == pytest.approx([1.0, 0.05, 0.48, 0.47], abs=1e-12)
    assert [[r.reward for r in g] for g in GROUPS] == rewards  # the env rewards are untouched

    # GroupNorm on two rewards a, b: (a - mean) / (|a - b| / 2 + eps) = +-1 scaled by |a - b| / (|a - b| + 2 eps)
    eps = 1e-6
    advantages = GroupNorm(eps=eps).token_advantages(shaped)
    for p, g in enumerate(want):
        gap = abs(g[0] - g[1])
        for i in range(2):
            a = (g[i] - (g[0] + g[1]) / 2) / (gap / 2 + eps)
            assert advantages[2 * p + i] == pytest.approx([a] * len(shaped[p][i].completion_ids), abs=1e-9)
    # group 1's env rewards are equal: raw advantage 0, shaped advantage +-1 from the KL alone (sign: lower KL wins)
    assert GroupNorm(eps=eps).token_advantages(GROUPS)[2] == [0.0]
    kl_low = 2 if expected_kl[2] < expected_kl[3] else 3
    assert advantages[kl_low][0] == pytest.approx(1.0, abs=1e-3)


@pytest.mark.unit
def test_shape_reports_the_mean_kl_and_shaped_reward():
    class Fixed(ReferenceScorer):
        def completion_logprobs(self, rollouts, temperature):
            return [torch.tensor(q) for q in REF]

    shaped, metrics = KLInReward(KLInRewardSettings(coef=0.1), Fixed(model_name="unused")).shape(GROUPS, 1.0)
    kl = by_hand("k1")
    assert metrics["kl_in_reward/kl_mean"] == pytest.approx(sum(kl) / 4, abs=1e-6)
    assert metrics["kl_in_reward/reward_shaped_mean"] == pytest.approx((2.0 - 0.1 * sum(kl)) / 4, abs=1e-6)
    assert KLInReward(KLInRewardSettings(), Fixed(model_name="unused")).shape([], 1.0) == ([], {})


@pytest.mark.unit
@pytest.mark.parametrize(
    "kwargs,message",
    [
        ({"coef": -0.1}, r"data.kl_in_reward.coef must be a finite number >= 0, got -0.1"),
        ({"coef": math.nan}, r"data.kl_in_reward.coef must be a finite number >= 0, got nan"),
        ({"coef": math.inf}, r"data.kl_in_reward.coef must be a finite number >= 0, got inf"),
        ({"estimator": "k4"}, r"data.kl_in_reward.estimator must be one of k1, k2, k3 \(grpokit.kl\), got 'k4'"),
    ],
)
def test_bad_settings_name_the_key(kwargs, message):
    with pytest.raises(ValueError, match=message):
        KLInRewardSettings(**kwargs)


@pytest.mark.unit
def test_an_advantage_that_ignores_the_reward_is_refused():
    with pytest.raises(ValueError, match=r"data.kl_in_reward shapes each rollout's reward, which data.advantage "):
        Orchestrator(advantage=Process(), kl_in_reward=KLInRewardSettings())
    Orchestrator(advantage=GroupNorm(), kl_in_reward=KLInRewardSettings())


@pytest.mark.unit
def test_a_kl_term_in_the_loss_as_well_is_allowed_with_a_warning(caplog):
    with caplog.at_level(logging.WARNING, logger="grpokit.orchestrator.kl_reward"):
        warn_if_loss_has_kl(KLInRewardSettings(coef=0.1), AIPO())
        warn_if_loss_has_kl(None, ClippedPG(beta=0.04))
        assert caplog.records == []
        warn_if_loss_has_kl(KLInRewardSettings(coef=0.1), ClippedPG(beta=0.04))
    assert "the penalty counts twice" in caplog.text and "ClippedPG" in caplog.text


@pytest.fixture(scope="module")
def small_lm():
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    config = LlamaConfig(
        vocab_size=97,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=2,
        num_key_value_heads=1,
        head_dim=16,
        max_position_embeddings=64,
        attn_implementation="sdpa",
    )
    return LlamaForCausalLM(config).eval().requires_grad_(False)


@pytest.mark.unit
@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_reference_logprobs_equal_a_plain_forward_of_each_sequence(small_lm, temperature):
    g = torch.Generator().manual_seed(1)

    def ids(n):
        return torch.randint(0, 97, (n,), generator=g).tolist()

    shared = ids(5)  # a group's rollouts share their prompt (run once as a prefix tree)
    rollouts = [
        rollout(0.0, [0.0] * 4, completion=ids(4), prompt=shared),
        rollout(0.0, [0.0] * 6, [1, 1, 0, 0, 1, 1], completion=ids(6), prompt=shared),
        rollout(0.0, [0.0] * 3, completion=ids(3), prompt=ids(20)),  # longer than a row: a row of its own
        rollout(0.0, [], completion=[], prompt=ids(2)),  # an empty completion
        rollout(0.0, [0.0] * 5, completion=ids(5), prompt=ids(4)),
    ]
    scorer = ReferenceScorer(model=small_lm, row_tokens=20)
    assert [len(row) for row in scorer._rows(rollouts)] == [2, 1, 2]
    got = scorer.completion_logprobs(rollouts, temperature)
    for r, logq_C in zip(rollouts, got):
        seq = torch.tensor(r.prompt_ids + r.completion_ids)
        logits = small_lm(seq[None]).logits[0].float() / temperature
        want = torch.log_softmax(logits, -1)[:-1].gather(-1, seq[1:, None]).squeeze(-1)[len(r.prompt_ids) - 1 :]
        want = want * torch.tensor(r.completion_mask, dtype=want.dtype)  # 0 where the head did not run
        assert logq_C.shape == (len(r.completion_ids),)
        torch.testing.assert_close(logq_C, want, rtol=0, atol=1e-5)


def test_fit_step_0_kl_is_zero_and_the_reference_stays_frozen(tmp_path, tiny_model):
    """The reference is the initial policy, so at step 0 (the engine samples with those weights) KL_seq is
    the engine/trainer numerics only; after a step of a large learning rate it is not, and the logged
    shaped reward is the env reward less coef * KL (no filters: the same rollouts)."""
    coef = 0.1
    argv = tiny_fit_argv(
        tmp_path,
        tiny_model,
        "r",
        *("--trainer.max_steps", "2", "--data.max_async_level", "0", "--model.lr", "3e-2"),
        *("--data.kl_in_reward.coef", str(coef), "--data.kl_in_reward.estimator", "k1"),
    )
    assert main(argv) == 0
    rows = read_metrics(tmp_path / "r")
    assert [int(r["step"]) for r in rows] == [0, 1]
    kl = [float(r["kl_in_reward/kl_mean"]) for r in rows]
    assert abs(kl[0]) < 1e-4, kl
    assert abs(kl[1]) > 1e-3, kl
    for r in rows:
        shaped = float(r["kl_in_reward/reward_shaped_mean"])
        assert shaped == pytest.approx(float(r["reward"]) - coef * float(r["kl_in_reward/kl_mean"]), abs=1e-6)
