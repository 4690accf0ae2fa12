"""Contract checks for components (loss, advantage, filter, noise scheduler), and the float64 loss
inputs the hand-computed tests build.

    from grpokit.testing import check_component
    check_component(MyLoss)          # raises AssertionError naming the broken rule

tests/test_contracts.py runs them over every registered subclass (built-ins and installed plugins).
Components are built with their defaults: every argument of a component needs a default.
"""

from __future__ import annotations

import torch

from grpokit.advantage import Advantage
from grpokit.filter import Filter
from grpokit.loss import Loss, LossInputs
from grpokit.noise import NoiseScheduler
from grpokit.types import Rollout


def check_component(cls: type) -> None:
    """Run the contract checks of `cls`'s kind (loss, advantage, filter or noise); other kinds are skipped."""
    for base, check in (
        (Loss, check_loss),
        (Advantage, check_advantage),
        (Filter, check_filter),
        (NoiseScheduler, check_noise_scheduler),
    ):
        if issubclass(cls, base):
            check(cls())


def make_loss_inputs(trainer, infer, adv, seq_ids=None, mask=None, **overrides) -> LossInputs:
    """float64 LossInputs from plain lists, for hand-computed tests; trainer logprobs require grad.

    seq_ids defaults to one sequence; loss_normalizer and step_num_seqs default to this micro-batch's
    loss tokens and sequences with loss tokens (as if it were the whole step); `overrides` replace any field.
    """
    seq_ids = list(seq_ids) if seq_ids is not None else [0] * len(trainer)
    mask_t = torch.tensor(mask if mask is not None else [1] * len(trainer), dtype=torch.float64)
    seq_ids_t = torch.tensor(seq_ids)
    with_loss = torch.zeros(max(seq_ids) + 1, dtype=torch.float64).index_add(0, seq_ids_t, mask_t) > 0
    fields = {
        "trainer_logprobs_T": torch.tensor(trainer, dtype=torch.float64, requires_grad=True),
        "inference_logprobs_T": torch.tensor(infer, dtype=torch.float64),
        "advantages_T": torch.tensor(adv, dtype=torch.float64),
        "loss_mask_T": mask_t,
        "seq_ids_T": seq_ids_t,
        "num_seqs": max(seq_ids) + 1,
        "loss_normalizer": float(mask_t.sum().clamp(min=1)),
        "step_num_seqs": max(int(with_loss.sum()), 1),
    }
    return LossInputs(**{**fields, **overrides})


def loss_and_grad(loss_fn: Loss, inputs: LossInputs) -> tuple[torch.Tensor, dict[str, torch.Tensor], list[float]]:
    """Run the loss, backpropagate, and return (loss, metrics, d loss / d trainer_logprobs as a list)."""
    loss, metrics = loss_fn(inputs)
    loss.backward()
    return loss, metrics, inputs.trainer_logprobs_T.grad.tolist()


def loss_inputs(trainer_T, inference_T, adv_T, mask_T, seq_ids_T, ref_T=None) -> LossInputs:
    return LossInputs(
        trainer_logprobs_T=trainer_T,
        inference_logprobs_T=inference_T,
        advantages_T=adv_T,
        loss_mask_T=mask_T,
        seq_ids_T=seq_ids_T,
        num_seqs=int(seq_ids_T.max()) + 1 if len(seq_ids_T) else 0,
        loss_normalizer=float(max(mask_T.sum().item(), 1)),
        step_num_seqs=max(int(seq_ids_T.max()) + 1 if len(seq_ids_T) else 1, 1),
        is_truncated_N=torch.zeros(int(seq_ids_T.max()) + 1 if len(seq_ids_T) else 0, dtype=torch.bool),
        ref_logprobs_T=ref_T,
    )


def check_loss(loss: Loss) -> None:
    """0-dim finite loss, 0-dim detached metrics, gradient on trainer logprobs, no NaN on edge inputs."""
    name = type(loss).__name__
    g = torch.Generator().manual_seed(0)
    cases = {
        "random": (12, torch.tensor([0] * 5 + [1] * 4 + [2] * 3), torch.ones(12)),
        "on-policy": (12, torch.tensor([0] * 5 + [1] * 4 + [2] * 3), torch.ones(12)),
        "single token": (1, torch.tensor([0]), torch.ones(1)),
        "all masked": (6, torch.tensor([0, 0, 0, 1, 1, 1]), torch.zeros(6)),
        "prompt tokens masked": (6, torch.tensor([0, 0, 0, 1, 1, 1]), torch.tensor([0.0, 1, 1, 0, 1, 1])),
    }
    for case, (t, seq_ids, mask) in cases.items():
        mask = mask.double()
        # a loss that trains on expert sequences gets the last sequence's loss tokens as expert tokens
        expert = ((seq_ids == seq_ids.max()) & (mask > 0)).double() if loss.needs_experts else torch.zeros_like(mask)
        mask = mask * (1 - expert)
        trainer = (-torch.rand(t, generator=g, dtype=torch.float64) * 3).requires_grad_(True)
        noise = 0.0 if case == "on-policy" else 0.05
        inference = trainer.detach() + noise * torch.randn(t, generator=g, dtype=torch.float64)
        adv = torch.randn(int(seq_ids.max()) + 1, generator=g, dtype=torch.float64)[seq_ids]
        ref = trainer.detach() - 0.1 if loss.needs_reference else None
        inputs = loss_inputs(trainer, inference, adv, mask, seq_ids, ref)
        if loss.needs_entropy:
            inputs.entropy_T = torch.rand(t, generator=g, dtype=torch.float64) * mask
        if loss.needs_teacher:
            inputs.teacher_logprobs_T = trainer.detach() + 0.2 * torch.randn(t, generator=g, dtype=torch.float64)
        if loss.needs_experts:
            inputs.expert_mask_T, inputs.expert_normalizer = expert, float(max(expert.sum().item(), 1))
        out, metrics = loss(inputs)
        assert out.dim() == 0 and torch.isfinite(out), f"{name} ({case}): loss must be a finite 0-dim tensor, got {out}"
        for key, value in metrics.items():
            assert torch.is_tensor(value) and value.dim() == 0 and not value.requires_grad, (
                f"{name} ({case}): metric {key} must be a detached 0-dim tensor"
            )
            assert torch.isfinite(value), f"{name} ({case}): metric {key} is {value}"
        out.backward()
        grad = trainer.grad
        assert grad is not None and torch.all(torch.isfinite(grad)), (
            f"{name} ({case}): gradient must reach trainer_logprobs_T and be finite"
        )
        assert torch.all(grad[(mask == 0) & (expert == 0)] == 0), (
            f"{name} ({case}): tokens outside the loss (and expert) mask must get zero gradient"
        )
        if case == "on-policy":  # off-policy tokens may all be clipped (GSPO's trust region is ~1e-4)
            assert grad.abs().sum() > 0, f"{name}: no gradient on on-policy tokens with non-zero advantages"


def check_advantage(advantage: Advantage) -> None:
    """Shape and dtype kept, finite, zero advantage for groups whose rewards are all equal; per token, each
    rollout's advantage on every completion token when its one step is the whole completion."""
    name = type(advantage).__name__
    g = torch.Generator().manual_seed(0)
    rewards = torch.rand(4, 6, generator=g, dtype=torch.float64)
    lengths = torch.randint(1, 30, (4, 6), generator=g).double()
    out = advantage(rewards, lengths)
    assert out.shape == rewards.shape and out.dtype == rewards.dtype, (
        f"{name}: output must have the rewards' shape and dtype"
    )
    assert torch.all(torch.isfinite(out)), f"{name}: non-finite advantages"
    equal = torch.full((3, 5), 0.5, dtype=torch.float64)
    zeros = advantage(equal, torch.ones_like(equal))
    assert torch.all(zeros == 0), f"{name}: groups with equal rewards must get exactly zero advantage, got {zeros}"
    groups = [
        [
            Rollout(
                example_id=p,
                env_id="e",
                group_id=p,
                prompt_ids=[1],
                completion_ids=[7] * int(n),
                completion_logprobs=[-0.5] * int(n),
                completion_mask=[1] * int(n),
                reward=float(r),
                is_truncated=False,
                policy_step=0,
                step_rewards=[float(r)],
                step_ends=[int(n) - 1],
            )
            for r, n in zip(rewards[p], lengths[p])
        ]
        for p in range(len(rewards))
    ]
    per_token = advantage.token_advantages(groups)
    expected = [[a] * int(n) for a, n in zip(out.flatten().tolist(), lengths.flatten().tolist())]
    assert len(per_token) == len(expected) and all(
        len(got) == len(want) and all(abs(x - y) <= 1e-9 for x, y in zip(got, want))
        for got, want in zip(per_token, expected)
    ), (
        f"{name}: token_advantages must give each rollout's advantage "
        "on each completion token when its one step spans the completion"
    )
    assert advantage.token_advantages([]) == [], f"{name}: token_advantages([]) must be []"


class StubTokenizer:
    """The policy's tokenizer as check_filter gives it to `Filter.connect`: a vocabulary of `size` ids
    (len), each decoding to one letter."""

    def __init__(self, size: int = 1000) -> None:
        self.size = size

    def __len__(self) -> int:
        return self.size

    def decode(self, token_ids, skip_special_tokens: bool = False) -> str:
        return "".join(chr(ord("a") + t % 26) for t in token_ids)


def check_filter(flt: Filter) -> None:
    """Once connected to a tokenizer, one bool per rollout; an empty list gives an empty list."""
    name = type(flt).__name__
    flt.connect(StubTokenizer())
    rollouts = [
        Rollout(
            example_id=i,
            env_id="e",
            group_id=0,
            prompt_ids=[1, 2],
            completion_ids=[3] * (i + 1),
            completion_logprobs=[-0.5] * (i + 1),
            completion_mask=[1] * (i + 1),
            reward=0.0,
            is_truncated=i % 2 == 1,
            policy_step=0,
        )
        for i in range(4)
    ]
    flags = flt.flag(rollouts)
    assert len(flags) == len(rollouts) and all(isinstance(f, bool) for f in flags), (
        f"{name}: flag() must return one bool per rollout"
    )
    assert flt.flag([]) == [], f"{name}: flag([]) must be []"


def check_noise_scheduler(scheduler: NoiseScheduler) -> None:
    """A finite sigma >= 0 for every step 0 .. max_steps (and past it), the same on every call (no state)."""
    name = type(scheduler).__name__
    for max_steps in (1, 7, 100):
        sigmas = [scheduler.sigma(step, max_steps) for step in range(max_steps + 2)]
        assert all(isinstance(s, float) and 0 <= s < float("inf") for s in sigmas), (
            f"{name}: sigma must be a finite float >= 0, got {sigmas}"
        )
        assert sigmas == [scheduler.sigma(step, max_steps) for step in range(max_steps + 2)], (
            f"{name}: sigma must be a pure function of (step, max_steps)"
        )
