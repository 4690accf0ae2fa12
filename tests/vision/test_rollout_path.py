"""Image prompts on the rollout path (issue 36, second slice), on each tiny family: the builtin engine
samples an image group whose logprobs the trainer's forward reproduces; a packed micro-batch of image
rollouts scores each sequence as alone and trains the text decoder's LoRA only; the batch codec carries
the image inputs under its checksum; a bad image is a logged skip naming its environment and example;
a text-only model is refused an image environment with the fix."""

from __future__ import annotations

import logging
from types import SimpleNamespace

import pytest
import torch

from grpokit.common.logprobs import packed_token_logprobs
from grpokit.common.models import load_causal_lm, load_tokenizer
from grpokit.environments.environment import Environment, EnvSpec
from grpokit.inference import SamplingSettings
from grpokit.inference.builtin import BuiltinEngine
from grpokit.inference.streams import GroupRequest
from grpokit.orchestrator.driver import RolloutDriver
from grpokit.orchestrator.image_prompts import ImagePrompts
from grpokit.orchestrator.packing import pack
from grpokit.orchestrator.prompt_length import prompt_token_ids
from grpokit.trainer.lora import LoraSettings, add_lora
from grpokit.trainer.metrics import mismatch_metrics
from grpokit.transport.codec import BatchChecksumError, decode_batch, encode_batch
from grpokit.types import Rollout, TrainingBatch
from grpokit.vision.render import render_prompt
from tests.vision.pictures import striped


def image_prompt(processor, seed: int, images: int = 1):
    content = [{"type": "image"}] * images + [{"type": "text", "text": f"What colour is shape {seed}?"}]
    pictures = [striped(56 + 14 * k, 42, seed + k) for k in range(images)]
    return render_prompt(processor, [{"role": "user", "content": content}], pictures)


def rollout(prompt, completion_ids: list[int], logprobs: list[float] | None = None, group_id: int = 0) -> Rollout:
    n = len(completion_ids)
    logprobs = logprobs if logprobs is not None else [-1.0] * n
    return Rollout(0, "shapes", group_id, prompt.prompt_ids, completion_ids, logprobs, [1] * n, 1.0, False, 0,
                   vision=prompt.vision)  # fmt: skip


def engine_for(path: str) -> BuiltinEngine:
    engine = BuiltinEngine(fast="off")
    engine.setup(path)
    return engine


@pytest.mark.parametrize("temperature", [1.0, 0.0], ids=["sampled", "greedy"])
def test_the_engines_image_group_logprobs_are_the_trainers(vl_family, temperature):
    _, path, processor, _ = vl_family
    engine, prompt = engine_for(path), image_prompt(processor, seed=4, images=2)
    sampling = SamplingSettings(temperature=temperature, max_tokens=6, seed=0)

    def sample(seed: int):
        stream = engine.open_stream(sampling, max_rows=8)
        stream.submit(GroupRequest("g", prompt.prompt_ids, 3, seed, vision=prompt.vision))
        (group,) = stream.advance()
        return group.completions

    completions = sample(seed=5)
    assert [c.token_ids for c in completions] == [c.token_ids for c in sample(seed=5)]  # seeded: reproduced
    rollouts = [rollout(prompt, c.token_ids, c.logprobs) for c in completions]
    (mb,) = pack(rollouts, [[1.0] * len(r.completion_ids) for r in rollouts], [True] * 3, seq_len=1024)
    with torch.no_grad():
        trainer_T = packed_token_logprobs(
            engine.model, mb.input_ids_T, mb.position_ids_T, mb.seq_lens_N, temperature or 1.0, vision=mb.vision
        )
    error = float(mismatch_metrics(trainer_T, mb.inference_logprobs_T, mb.loss_mask_T)["token_mult_prob_error"])
    assert abs(error - 1) < 1e-4
    assert mb.num_loss_tokens == sum(len(c.token_ids) for c in completions) > 0


def test_a_packed_micro_batch_of_image_rollouts_scores_each_as_alone(vl_family):
    """Two image rollouts (one and two images) packed into one row give each one's logprobs alone, with
    the loss mask on completion tokens only; LoRA (the trainer's default targets) trains the text decoder,
    and no vision tower or projector weight gets a gradient."""
    _, path, processor, _ = vl_family
    lm = add_lora(load_causal_lm(path), LoraSettings(rank=4), gradient_checkpointing=False)
    torch.manual_seed(0)
    for name, p in lm.named_parameters():
        if "lora_B" in name:  # peft starts B at 0: make the adapter change the logits
            torch.nn.init.normal_(p, std=0.1)
    a, b = image_prompt(processor, seed=1), image_prompt(processor, seed=2, images=2)
    rollouts = [rollout(a, [11, 12, 13]), rollout(b, [21, 22], group_id=1)]
    advantages = [[1.0] * len(r.completion_ids) for r in rollouts]
    (packed,) = pack(rollouts, advantages, [True, True], seq_len=1024)
    alone = [pack([r], [adv], [True], seq_len=1024)[0] for r, adv in zip(rollouts, advantages)]

    def logprobs(mb):
        return packed_token_logprobs(lm, mb.input_ids_T, mb.position_ids_T, mb.seq_lens_N, vision=mb.vision)

    packed_T = logprobs(packed)
    torch.testing.assert_close(packed_T.detach(), torch.cat([logprobs(mb) for mb in alone]).detach(), atol=1e-5, rtol=0)
    n_a, n_b = len(a.prompt_ids), len(b.prompt_ids)  # completion tokens only: never a prompt or image token
    assert packed.loss_mask_T.nonzero().squeeze(-1).tolist() == [n_a, n_a + 1, n_a + 2, n_a + 3 + n_b, n_a + 4 + n_b]
    assert packed.vision.tensors["pixel_values"].shape[packed.vision.image_dims["pixel_values"]] == sum(
        r.vision.tensors["pixel_values"].shape[r.vision.image_dims["pixel_values"]] for r in rollouts
    )
    (packed_T * packed.loss_mask_T).sum().backward()
    trained = {n for n, p in lm.named_parameters() if p.requires_grad}
    assert trained and all("lora_" in n and (".language_model." in n or ".text_model." in n) for n in trained)
    assert all(lm.get_parameter(n).grad is not None and lm.get_parameter(n).grad.abs().sum() > 0 for n in trained)


def test_the_codec_carries_image_inputs_under_its_checksum(vl_family):
    _, _, processor, _ = vl_family
    a, b = image_prompt(processor, seed=1), image_prompt(processor, seed=2, images=2)
    rollouts = [rollout(a, [11, 12]), rollout(b, [21, 22, 23], group_id=1)]
    micro_batches = pack(rollouts, [[0.5, -0.5], [1.0, 0.0, 2.0]], [True, True], seq_len=1024)
    data = encode_batch(TrainingBatch(step=3, micro_batches=micro_batches, temperature=0.7))
    (mb,) = decode_batch(data).micro_batches
    assert mb.vision.image_dims == micro_batches[0].vision.image_dims
    for name, tensor in micro_batches[0].vision.tensors.items():
        assert torch.equal(mb.vision.tensors[name], tensor), name
    assert torch.equal(mb.input_ids_T, micro_batches[0].input_ids_T)
    header_len = int.from_bytes(data[:8], "little")
    assert b'"version":"4"' in data[8 : 8 + header_len]  # images: version 4; a text batch stays 3
    damaged = bytearray(data)
    damaged[-3] ^= 0xFF  # the last tensor's bytes
    with pytest.raises(BatchChecksumError, match="step 3 is damaged"):
        decode_batch(bytes(damaged))
    text_batch = encode_batch(TrainingBatch(step=0, micro_batches=pack([rollout(a, [5])], [[1.0]], [True], 1024)[:0]))
    assert b'"version":"3"' in text_batch[: 8 + int.from_bytes(text_batch[:8], "little")]


def shapes_env(num_tasks: int = 4) -> Environment:
    return Environment(EnvSpec("shapes", {"num_tasks": num_tasks}))


def test_a_bad_image_is_a_logged_skip_naming_the_environment_and_example(vl_family, caplog):
    _, path, _, _ = vl_family
    env = shapes_env()
    broken = env.examples[1]
    part = broken.messages[0]["content"][0]
    broken.messages[0]["content"][0] = {**part, "image_url": {"url": "data:image/png;base64,bm90IGFuIGltYWdl"}}
    tokenizer = load_tokenizer(path)
    items = [(env, ex) for ex in env.examples]
    loop = SimpleNamespace(
        settings=SimpleNamespace(rollouts_per_example=2, seq_len=1024, buffer=SimpleNamespace(rounds=1)),
        shape=SimpleNamespace(prompts_per_step=4, steps_per_generation=1),
        engine=SimpleNamespace(context_length=lambda: None),
        prompts_per_block=lambda: 4,
        prompts=SimpleNamespace(take=lambda block, n: items, blocks_per_pass=lambda n: 1),
        images=ImagePrompts.for_envs(tokenizer, [env]),
        tokenizer=tokenizer,
        prompt_limit=900,
        block_seed=lambda block: 7,
    )
    with caplog.at_level(logging.WARNING):
        pending, too_long = RolloutDriver(loop, None)._block(0)
    assert [p.group_id for p in pending] == [0, 2, 3] and too_long == 0
    assert all(p.vision and p.vision.tensors["pixel_values"].numel() > 0 for p in pending)
    assert "environment 'shapes' example 1" in caplog.text and "unreadable" in caplog.text
    assert "skipped" in caplog.text


def test_an_image_environment_is_refused_a_text_only_model_with_the_fix(tiny_model):
    with pytest.raises(ValueError, match=r"environment 'shapes' \(example 0\) has images, .* text-only model .*"
                       r"set model\.model to a vision-language model"):  # fmt: skip
        ImagePrompts.for_envs(load_tokenizer(tiny_model), [shapes_env()])
    assert ImagePrompts.for_envs(load_tokenizer(tiny_model), []) is None  # no images: the text path
    with pytest.raises(ValueError, match="example 0: its prompt holds images, which the model's processor renders"):
        prompt_token_ids(load_tokenizer(tiny_model), shapes_env().examples[0])  # the template would drop them


def test_the_pixel_budget_resizes_or_refuses_an_images_prompt(vl_family, caplog):
    """data.pixel_budget: a 112x112 picture over a 56x56 budget is scaled down with `resize` (Qwen2.5-VL:
    fewer image tokens than unbudgeted), and its prompt skipped, naming the example and the budget, with
    `refuse`."""
    from grpokit.vision.images import PixelBudget
    from grpokit.vision.logprobs import image_token_ids

    family, path, _, model = vl_family
    env = Environment(EnvSpec("shapes", {"num_tasks": 2, "size": 112}))
    tokenizer, items = load_tokenizer(path), [(env, ex) for ex in env.examples]
    placeholders = image_token_ids(model.config)

    def image_tokens(budget):
        _, ids, _ = ImagePrompts.for_envs(tokenizer, [env], budget=budget).render_all(items)
        return [sum(t in placeholders for t in prompt) for prompt in ids]

    full, resized = image_tokens(None), image_tokens(PixelBudget(56 * 56))
    assert all(0 < r <= f for r, f in zip(resized, full))
    if family == "qwen2_5_vl":  # Idefics3's processor scales every image to its longest_edge (112) again
        assert all(r < f for r, f in zip(resized, full))
    with caplog.at_level(logging.WARNING):
        usable, _, _ = ImagePrompts.for_envs(tokenizer, [env], budget=PixelBudget(56 * 56, "refuse")).render_all(items)
    assert usable == [] and "environment 'shapes' example 0" in caplog.text and "over the budget of 3136" in caplog.text
