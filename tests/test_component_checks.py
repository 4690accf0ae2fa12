"""A user's component that breaks its kind's contract stops the step with an error naming the component
and the contract, where it used to fail later without naming either (or, for two filters of one class,
not fail at all): a loss's output, an advantage's shape and values, a filter's flag count and name."""

import pytest
import torch

from grpokit.advantage import Advantage
from grpokit.filter import Filter, flag_all
from grpokit.loss import Loss, checked_output
from grpokit.registry.advantages.group_norm import GroupNorm
from grpokit.registry.losses.clipped_pg import ClippedPG
from grpokit.testing import make_loss_inputs
from grpokit.types import Rollout
from tests.support import make_group


class Returns(Loss):
    def __init__(self, out=None) -> None:
        self.out = out

    def __call__(self, inputs):
        return self.out


INPUTS = make_loss_inputs([-1.0, -2.0], [-1.1, -2.0], [0.5, 0.5])


@pytest.mark.parametrize(
    ("out", "message"),
    [
        ((torch.ones(2), {}), "model.loss Returns returned a tensor of shape (2,) as its loss; a Loss returns (loss"),
        (torch.tensor(1.0), "model.loss Returns returned Tensor; a Loss returns (loss, metrics)"),
        ((torch.tensor(1.0), None), "model.loss Returns returned NoneType as its metrics"),
        ((torch.tensor(1.0), {"kl": torch.ones(3)}), "model.loss Returns: metric 'kl' is shape (3,)"),
        ((torch.tensor(1.0), {"kl": "0.1"}), "model.loss Returns: metric 'kl' is str"),
    ],
    ids=["per-token loss", "no metrics", "metrics None", "metric not 0-dim", "metric a str"],
)
def test_a_loss_output_off_contract_is_refused_naming_the_loss(out, message):
    with pytest.raises(TypeError) as e:
        checked_output(Returns(out), Returns(out)(INPUTS))
    assert message in str(e.value)


def test_a_builtin_loss_output_passes_unchanged_and_what_used_to_work_still_does():
    loss = ClippedPG()
    value, metrics = loss(INPUTS)
    assert checked_output(loss, (value, metrics)) == (value, metrics)
    # a (1,)-shaped loss and metrics as floats or one-element tensors trained before the check: kept
    value, metrics = checked_output(Returns(), (torch.ones(1), {"a": 0.5, "b": torch.ones(1)}))
    assert value.shape == () and metrics == {"a": 0.5, "b": torch.ones(1)}


def rollouts(rewards: list[list[float]]) -> list[list[Rollout]]:
    return [make_group(group, group_id=p) for p, group in enumerate(rewards)]


class PerPrompt(Advantage):
    def __call__(self, rewards_PG, lengths_PG):
        return rewards_PG.mean(-1)  # P values: one per group, not per rollout


class Divides(Advantage):
    def __call__(self, rewards_PG, lengths_PG):
        return rewards_PG / rewards_PG.std(-1, keepdim=True)  # 0/0 for a group of equal rewards


def test_an_advantage_of_another_shape_or_not_finite_is_refused_naming_it():
    groups = rollouts([[0.0, 1.0], [0.5, 0.5]])
    with pytest.raises(ValueError, match=r"data.advantage: PerPrompt returned \(2,\) for rewards of shape \(2, 2\)"):
        PerPrompt().token_advantages(groups)  # used to pair 2 values with 4 rollouts, and crash in packing
    with pytest.raises(ValueError, match="data.advantage: Divides returned non-finite advantages for finite rewards"):
        Divides().token_advantages(groups)  # used to be blamed on the loss (lower model.lr) steps later
    assert GroupNorm().token_advantages(groups)[2:] == [[0.0, 0.0], [0.0, 0.0]]
    assert Flat().token_advantages(groups) == GroupNorm().token_advantages(groups)  # P*G flat: paired as before


class Flat(GroupNorm):
    def __call__(self, rewards_PG, lengths_PG):
        return super().__call__(rewards_PG, lengths_PG).flatten()


class LongerThan(Filter):
    def __init__(self, limit: int = 1, enforce: bool = True) -> None:
        super().__init__(enforce)
        self.limit = limit

    def flag(self, rollouts):
        return [len(r.completion_ids) > self.limit for r in rollouts]


class OneFlag(Filter):
    def __init__(self) -> None:  # no super().__init__(): still a filter that enforces
        pass

    def flag(self, rollouts):
        return [True]


def test_two_filters_of_one_class_keep_their_own_flags():
    """Flags were keyed by class name, so the watching LongerThan(100) replaced the enforcing
    LongerThan(1)'s flags and nothing was masked."""
    batch = [r for g in rollouts([[0.0, 1.0]]) for r in g]
    flags = flag_all([LongerThan(1), LongerThan(100, enforce=False), LongerThan(0)], batch)
    assert flags == {"longerthan": [True, True], "longerthan_2": [False, False], "longerthan_3": [True, True]}


def test_a_filter_with_the_wrong_number_of_flags_is_refused_naming_it():
    batch = [r for g in rollouts([[0.0, 1.0]]) for r in g]
    assert OneFlag().enforce is True
    with pytest.raises(ValueError, match="data.filters: OneFlag.flag returned 1 flags for 2 rollouts"):
        flag_all([OneFlag()], batch)
