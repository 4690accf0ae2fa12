"""data.kl_in_reward with image prompts (issue 36), on each tiny family: the reference scorer's logprobs of
image rollouts (one and two pictures, beside a text rollout) are the trainer's own (Policy._logprobs of the
packed micro-batch, images and the model's positions included) however the scorer packs its rows; a
`grpokit fit` of the shapes environment with kl_in_reward logs KL_seq ~0 at step 0 (the reference is the
policy that sampled it), shaped rewards of reward - coef x KL, and a KL away from 0 once the policy moved."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from grpokit.main import main
from grpokit.orchestrator.kl_reward import ReferenceScorer
from grpokit.orchestrator.packing import pack
from grpokit.trainer.policy import Policy
from grpokit.types import Rollout
from grpokit.vision.render import render_prompt
from tests.support import read_metrics
from tests.vision.pictures import striped
from tests.vision.test_fit_images import image_fit_argv


def image_prompt(processor, seed: int, images: int):
    content = [{"type": "image"}] * images + [{"type": "text", "text": "What colour is the shape?"}]
    pictures = [striped(56 + 14 * k, 42, seed + k) for k in range(images)]
    return render_prompt(processor, [{"role": "user", "content": content}], pictures)


def rollouts_of(processor) -> list[Rollout]:
    """Two groups with images (one picture; two pictures) and a text prompt, completions of plain-text ids
    (below the processors' added image tokens), one with an environment token (completion_mask 0)."""
    one, two = image_prompt(processor, seed=1, images=1), image_prompt(processor, seed=2, images=2)
    text_ids = processor.tokenizer("Name a colour.")["input_ids"]
    g = torch.Generator().manual_seed(0)

    def make(prompt_ids, vision, n: int, group: int, mask=None) -> Rollout:
        completion = torch.randint(100, 5000, (n,), generator=g).tolist()
        return Rollout(group, "shapes", group, prompt_ids, completion, [-1.0] * n, mask or [1] * n, 0.0, False, 0,
                       vision=vision)  # fmt: skip

    return [
        make(one.prompt_ids, one.vision, 4, 0),
        make(one.prompt_ids, one.vision, 5, 0, mask=[1, 1, 0, 1, 1]),
        make(two.prompt_ids, two.vision, 3, 1),
        make(text_ids, None, 4, 2),
        make(two.prompt_ids, two.vision, 6, 1),
    ]


@pytest.mark.parametrize("temperature", [1.0, 0.7])
@pytest.mark.parametrize("row_tokens", [1, 4096], ids=["a-row-each", "one-row"])
def test_reference_logprobs_of_image_rollouts_are_the_trainers(vl_family, temperature, row_tokens):
    _, _, processor, model = vl_family
    rollouts = rollouts_of(processor)
    scorer = ReferenceScorer(model=model, row_tokens=row_tokens)
    got = scorer.completion_logprobs(rollouts, temperature)

    # the trainer: one micro-batch of all five (text and image sequences in one row), its own logprob call
    (mb,) = pack(rollouts, [[1.0] * len(r.completion_ids) for r in rollouts], [True] * len(rollouts), seq_len=4096)
    assert mb.vision is not None and mb.seq_lens_N.tolist() == [r.num_tokens for r in rollouts]
    trainer = SimpleNamespace(share_prefixes=True, logprob_chunk_size=0, compile_layers=False)
    with torch.no_grad():
        trainer_T = Policy._logprobs(trainer, model, mb, temperature)
    start = 0
    for r, logq_C in zip(rollouts, got):
        want_C = trainer_T[start + len(r.prompt_ids) : start + r.num_tokens]
        start += r.num_tokens
        assert logq_C.shape == (len(r.completion_ids),) and logq_C.dtype == torch.float32
        torch.testing.assert_close(logq_C, want_C, rtol=0, atol=1e-5)
        mask_C = torch.tensor(r.completion_mask, dtype=torch.bool)
        assert bool((logq_C[mask_C] < 0).all()) and bool((logq_C[~mask_C] == 0).all())


def test_reference_logprobs_depend_on_the_rollouts_pictures(vl_family):
    """The same ids with another prompt's pictures score differently: the images reach the reference."""
    _, _, processor, model = vl_family
    rollout = rollouts_of(processor)[0]
    other = image_prompt(processor, seed=7, images=1)
    assert other.prompt_ids == rollout.prompt_ids  # same picture size: the same ids
    swapped = Rollout(**{**rollout.__dict__, "vision": other.vision})
    scorer = ReferenceScorer(model=model)
    mine, theirs = scorer.completion_logprobs([rollout, swapped], 1.0)
    assert (mine - theirs).abs().max() > 1e-4


def test_fit_with_kl_in_reward_on_image_prompts_shapes_the_rewards(vl_family, tmp_path, monkeypatch):
    """The shapes environment with data.kl_in_reward: at step 0 the engine sampled with the reference's
    weights, so KL_seq is ~0; the logged shaped reward is reward - coef x KL each step; after a step of a
    large learning rate (a reward that varies within groups: odd-length replies score 1) the KL is not 0."""
    import verifiers.v1 as vf

    from grpokit.envs.shapes import ShapesTask

    @vf.reward(weight=1.0)
    async def correct(self, trace) -> float:
        return float(len(trace.last_reply or "") % 2)

    monkeypatch.setattr(ShapesTask, "correct", correct)
    family, path, _, _ = vl_family
    coef = 0.1
    extra = ["--model.lr", "3e-2", "--data.kl_in_reward.coef", str(coef), "--data.kl_in_reward.estimator", "k1"]
    assert main(image_fit_argv(tmp_path, path, family, *extra)) == 0
    rows = read_metrics(tmp_path / family)
    assert [int(r["step"]) for r in rows] == [0, 1]
    kl = [float(r["kl_in_reward/kl_mean"]) for r in rows]
    print(f"{family}: kl_in_reward/kl_mean {kl}, step 0 token_mult_prob_error {rows[0]['token_mult_prob_error']}")
    assert abs(kl[0]) < 1e-4, kl
    assert abs(kl[1]) > 1e-3, kl
    for r in rows:
        shaped = float(r["kl_in_reward/reward_shaped_mean"])
        assert shaped == pytest.approx(float(r["reward"]) - coef * float(r["kl_in_reward/kl_mean"]), abs=1e-6)
