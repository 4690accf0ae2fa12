"""Prompts with images -> token ids and image inputs, rendered once per prompt with the model's processor.

An environment's prompt may hold image content parts (`{"type": "image_url", "image_url": {"url":
"data:image/png;base64,..."}}`, or `{"type": "image", "image" | "url" | "path": ...}`; verifiers passes
them through unchanged). Such a prompt is rendered by the policy's processor (grpokit.vision.render:
the chat template, the image placeholders expanded, pixel values and image grids), once per prompt; the
ids go to the engine and the trainer, and the image inputs travel with the group (PendingGroup ->
GroupRequest -> Rollout.vision). Prompts without images keep the tokenizer's chat template
(grpokit.orchestrator.prompt_length.prompt_token_ids), unchanged.

Checked at the start, not mid-run (`ImagePrompts.for_envs`): an environment with images given a text-only
model or an engine that cannot sample images (all but BuiltinEngine's plain path, RemoteEngine in front
of `grpokit infer` and VLLMEngine, for now) is refused with the fix. A verifiers Env episode's prompts are
rendered here too (the skip of a bad image, the prompt-length check), and again by the episode for each of
its roles (grpokit.environments.episodes: the episode decides what a role's prompt holds). A prompt whose
image cannot be used (missing, unreadable, over data.pixel_budget with `over_budget: refuse`: ImageError) is
skipped and logged with its environment and example, and recorded as `bad_image` in prompts.jsonl
(grpokit.orchestrator.accounting), never a crash mid-run.
"""

from __future__ import annotations

import logging

from grpokit.environments.environment import Environment, Example
from grpokit.orchestrator.prompt_length import prompt_token_ids
from grpokit.vision.images import ImageError, PixelBudget
from grpokit.vision.inputs import VisionInputs
from grpokit.vision.messages import has_images, prompt_images
from grpokit.vision.render import check_vision_model, load_processor, render_prompt

log = logging.getLogger(__name__)


def first_image_example(env: Environment) -> Example | None:
    return next((ex for ex in env.examples if has_images(ex.messages)), None)


class ImagePrompts:
    """The policy's processor, loaded from the tokenizer's folder, and the pixel budget of its images."""

    def __init__(self, tokenizer, budget: PixelBudget | None = None) -> None:
        self.tokenizer, self.budget = tokenizer, budget or PixelBudget()
        self.processor = load_processor(tokenizer.name_or_path)

    @classmethod
    def for_envs(
        cls,
        tokenizer,
        envs: list[Environment],
        eval_envs: list[Environment] = (),
        engine=None,
        budget: PixelBudget | None = None,
    ) -> ImagePrompts | None:
        """The renderer (images within `budget`: data.pixel_budget) when an environment has prompts with
        images (None when none has: the text path); refuses what cannot be trained (see the module
        docstring), and an `engine` that cannot sample them (one without `samples_images`)."""
        with_images = [(env, ex) for env in [*envs, *eval_envs] if (ex := first_image_example(env)) is not None]
        if not with_images:
            return None
        env, ex = with_images[0]
        check_vision_model(tokenizer.name_or_path, f"environment {env.name!r} (example {ex.index})")
        if engine is not None and not getattr(engine, "samples_images", False):
            raise ValueError(
                f"environment {with_images[0][0].name!r} has prompts with images, which {type(engine).__name__} "
                "cannot sample yet (fast path): use inference BuiltinEngine with fast: off, RemoteEngine in front of "
                "`grpokit infer`, or VLLMEngine (docs/vision.md)"
            )
        return cls(tokenizer, budget)

    def render(self, env: Environment, example: Example) -> tuple[list[int], VisionInputs | None]:
        """(prompt token ids, image inputs or None for a prompt without images); ImageError names the example."""
        if not has_images(example.messages):
            return prompt_token_ids(self.tokenizer, example), None
        label = f"environment {env.name!r} example {example.index}"
        messages, images = prompt_images(example.messages, self.budget, label)
        try:
            rendered = render_prompt(self.processor, messages, images, keep_source=True)  # vLLM: ImageSource
        except (ValueError, OSError) as e:  # the processor refusing an image (too small, odd mode)
            raise ImageError(f"the processor cannot take its images: {e}", label) from e
        return rendered.prompt_ids, rendered.vision

    def render_all(self, prompts: list[tuple[Environment, Example]]):
        """(the prompts whose images could be used, their token ids, their image inputs by id(example)):
        a prompt with a bad image is logged, naming its environment and example, and left out."""
        usable, ids, vision = [], [], {}
        for env, ex in prompts:
            try:
                prompt_ids, inputs = self.render(env, ex)
            except ImageError as e:
                log.warning("%s; skipped (prompts.jsonl: bad_image)", e)
                continue
            usable.append((env, ex))
            ids.append(prompt_ids)
            if inputs is not None:
                vision[id(ex)] = inputs
        return usable, ids, vision
