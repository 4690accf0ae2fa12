"""Token faithfulness (issue 36, must-show 1) on each family: the trainer-side logprobs of a completion
sampled to an image prompt equal the sampler's, and only completion tokens are in the loss mask."""

from __future__ import annotations

import pytest
import torch

from grpokit.trainer.metrics import mismatch_metrics
from grpokit.vision.logprobs import completion_loss_mask, image_token_ids, packed_vision_logprobs
from grpokit.vision.positions import mm_token_type_ids
from grpokit.vision.render import render_prompt
from grpokit.vision.sample import sample_completion
from tests.vision.pictures import striped


def two_image_prompt(processor, seed: int):
    content = [
        {"type": "image"},
        {"type": "text", "text": "Compare the first picture"},
        {"type": "image"},
        {"type": "text", "text": "with the second."},
    ]
    images = [striped(70, 42, seed), striped(28, 84, seed + 1)]
    return render_prompt(processor, [{"role": "user", "content": content}], images)


@pytest.mark.parametrize("temperature,seed", [(0.0, None), (1.0, 3)], ids=["greedy", "sampled"])
def test_trainer_logprobs_equal_the_samplers(vl_family, temperature, seed):
    family, _, processor, model = vl_family
    prompt = two_image_prompt(processor, seed=5)
    completion = sample_completion(model, prompt, max_tokens=8, temperature=temperature, seed=seed)
    assert len(completion.token_ids) == len(completion.logprobs) > 0
    ids_T = torch.tensor(prompt.prompt_ids + completion.token_ids)
    seq_lens_N, prompt_lens_N = torch.tensor([len(ids_T)]), torch.tensor([len(prompt.prompt_ids)])
    with torch.no_grad():
        trainer_T = packed_vision_logprobs(model, ids_T, seq_lens_N, prompt.vision, temperature)
    mask_T = completion_loss_mask(ids_T, seq_lens_N, prompt_lens_N, image_token_ids(model.config))
    engine_T = torch.zeros(len(ids_T))
    engine_T[len(prompt.prompt_ids) :] = torch.tensor(completion.logprobs)
    error = float(mismatch_metrics(trainer_T, engine_T, mask_T)["token_mult_prob_error"])
    print(f"{family} {'greedy' if seed is None else 'sampled'}: token_mult_prob_error = {error:.9f}")
    assert abs(error - 1) < 1e-4
    assert int(mask_T.sum()) == len(completion.token_ids)


def test_the_loss_mask_is_never_on_a_prompt_or_image_token(vl_family):
    _, _, processor, model = vl_family
    prompt = two_image_prompt(processor, seed=1)
    placeholders = image_token_ids(model.config)
    n = len(prompt.prompt_ids)
    completion = [11, 12, model.config.image_token_id, 13]  # a placeholder in the completion is still masked
    ids_T = torch.tensor(prompt.prompt_ids + completion + prompt.prompt_ids + [14])
    seq_lens_N, prompt_lens_N = torch.tensor([n + 4, n + 1]), torch.tensor([n, n])
    mask_T = completion_loss_mask(ids_T, seq_lens_N, prompt_lens_N, placeholders)
    assert mask_T.nonzero().squeeze(-1).tolist() == [n, n + 1, n + 3, 2 * n + 4]
    assert not mask_T[torch.isin(ids_T, torch.tensor(sorted(placeholders)))].any()
    assert int((ids_T == model.config.image_token_id).sum()) > 2  # the prompt holds image placeholders


def test_positions_are_the_models_own(vl_family):
    """A sequence scored with grpokit's position ids (the Qwen family's 3-D ones from get_rope_index)
    gets the logits of the model's own forward, which computes its positions itself."""
    family, _, processor, model = vl_family
    prompt = two_image_prompt(processor, seed=2)
    ids_T = torch.tensor(prompt.prompt_ids + [100, 200, 300])
    kwargs = prompt.vision.model_kwargs()
    if family == "qwen2_5_vl":
        kwargs["mm_token_type_ids"] = mm_token_type_ids(model.config, ids_T[None])
    with torch.no_grad():
        reference_V = torch.log_softmax(model(input_ids=ids_T[None], **kwargs).logits[0, :-1], -1)
        ours_T = packed_vision_logprobs(model, ids_T, torch.tensor([len(ids_T)]), prompt.vision)
    expected_T = reference_V.gather(-1, ids_T[1:, None]).squeeze(-1)
    torch.testing.assert_close(ours_T[1:], expected_T, atol=1e-5, rtol=0)


def test_a_seed_reproduces_a_sampled_completion_and_another_seed_differs(vl_family):
    _, _, processor, model = vl_family
    prompt = two_image_prompt(processor, seed=3)
    first, again = (sample_completion(model, prompt, max_tokens=4, temperature=1.0, seed=11) for _ in range(2))
    other = sample_completion(model, prompt, max_tokens=4, temperature=1.0, seed=12)
    assert first.token_ids == again.token_ids and first.logprobs == again.logprobs
    assert other.token_ids != first.token_ids


def test_a_completion_ends_before_an_image_placeholder_and_at_a_stop_token():
    from grpokit.vision.sample import _finished

    assert _finished([5, 6, 99, 7], [-1.0, -2.0, -3.0, -4.0], eos={2}, placeholders={99}).token_ids == [5, 6]
    assert _finished([5, 6, 99, 7], [-1.0] * 4, eos={2}, placeholders={99}).finish_reason == "image_token"
    stopped = _finished([5, 2, 7], [-1.0, -2.0, -3.0], eos={2}, placeholders={99})
    assert (stopped.token_ids, stopped.logprobs, stopped.finish_reason) == ([5, 2], [-1.0, -2.0], "stop")
    assert _finished([5, 6], [-1.0, -2.0], eos={2}, placeholders={99}).finish_reason == "length"
