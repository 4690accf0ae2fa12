"""Prompts with images on `grpokit infer`: chat image parts rendered with the model's processor, token-id
prompts sent with their image inputs (RemoteEngine) or with their pictures (vLLM's token-in route), all
sampled on the builtin engine's image path.

- `POST /v1/chat/completions`: a message's content may hold image parts, `{"type": "image_url",
  "image_url": {"url": "data:image/png;base64,..."}}` or `{"type": "image", "image" | "url": "data:..."}`.
  The server renders the chat with the model's processor (grpokit.vision.render.render_prompt: the image
  placeholders expanded, the image tensors made), as the orchestrator renders an environment's image
  prompt. Only `data:` URLs are read: the server opens no file and fetches no URL for a client.
- `POST /v1/completions` with token-id prompts and grpokit's `vision` field: the prompt's image inputs
  as the orchestrator rendered them (grpokit.vision.inputs.VisionInputs), base64 safetensors bytes with
  their header as metadata (`to_base64`). RemoteEngine sends these rather than the pictures: the ids
  already hold the placeholders the processor expanded, and the tensors are bit for bit those the
  trainer scores with (a picture rendered again by the server's processor could differ: another
  pixel budget, a resize), so the server samples exactly the prompt the trainer sees, and safetensors
  carries tensors only (no pickle). One `vision` serves every prompt of the request (a group's prompt,
  or its continuations: each its prompt plus the tokens so far).
- `POST /inference/v1/generate` with `content_parts`, vLLM's shape for pictures on its token-in route (what
  renderers.client.generate sends with process_multimodal=False, and grpokit's VLLMEngine too):
  `token_ids` before expansion, one image placeholder token per picture, and the pictures as
  `{"type": "image_url", "url": "data:..."}` in order. Each placeholder token is replaced by the ids the
  processor makes of its picture (grpokit.vision.render.expand_image_ids; the other ids stay as sent), and
  the answer gives the expanded `prompt_token_ids` and each picture's `mm_placeholders` range, as vLLM's
  does. vLLM's other multimodal field, `features` (its processed tensors, in vLLM's own msgpack per
  model), is refused naming content_parts: decoding it would need vLLM, and it leaves out the placeholder
  masks Idefics3 needs.

Sampling: each prompt's n rows by grpokit.inference.image_rows.sample_image_group (prefilled alone with
its image inputs and the model's own positions, decoded by the plain sampler; the in-process engine's
stream samples image groups the same way), one generator seeded with the request's seed for all its
prompts. The tokens are reported when a prompt's rows end (a streamed answer gets them in one chunk, so
an update cannot cut such a request: it ends on the weights it began with); no top logprobs.

Refused with a 400 naming the fix: images for a text-only model, or for an engine that cannot sample them
(BuiltinEngine's fast path); a `vision` whose tensors are not the model's image inputs, or that do not
match the prompt's image placeholders; `content_parts` whose pictures cannot be read, or that are not one
per placeholder token in `token_ids`. `GET /v1/models` says whether the server takes images (`images`
in the model card), which RemoteEngine asks before it sends any.
"""

from __future__ import annotations

import contextlib
import inspect

import torch
from PIL import Image

from grpokit.common.models import is_vision_language, unwrap_peft
from grpokit.inference import Completion, NewTokens, SamplingSettings, ServingOptions
from grpokit.inference.server.errors import RequestError
from grpokit.vision.images import ImageError, load_image
from grpokit.vision.inputs import VisionInputs, from_base64
from grpokit.vision.messages import split_images

INPUT_PREFIXES = ("pixel_", "image_")  # the model's image keyword arguments (pixel_values, image_grid_thw, ...)


class ServedImages:
    """What the server does with images, for its engine and tokenizer (see the module docstring)."""

    def __init__(self, engine, tokenizer, model_name: str) -> None:
        self.engine, self.model_name = engine, model_name
        self.path = getattr(tokenizer, "name_or_path", None)
        model = getattr(engine, "model", None)
        config = getattr(model, "config", None)
        self.vision_language = config is not None and is_vision_language(config)
        self.samples = bool(getattr(engine, "samples_images", False))
        self.input_names: frozenset[str] = frozenset()
        if self.vision_language:
            forward = inspect.signature(unwrap_peft(model).forward).parameters
            self.input_names = frozenset(name for name in forward if name.startswith(INPUT_PREFIXES))
        self._processor = None

    @property
    def available(self) -> bool:
        return self.vision_language and self.samples

    def check(self, param: str) -> None:
        """A RequestError (400) naming the fix unless this server samples prompts with images."""
        if not self.vision_language:
            raise RequestError(
                f"this server's model `{self.model_name}` is a text-only model and takes no images: serve a "
                "vision-language model (`grpokit infer --model.model` Qwen2.5-VL, Idefics3/SmolVLM, "
                "smollm2-135m-vision) or send text only",
                param,
            )
        if not self.samples:
            path = " on its fast CUDA path" if getattr(self.engine, "fast", False) else ""
            raise RequestError(
                f"this server's engine ({type(self.engine).__name__}{path}) cannot sample prompts with images: "
                "start `grpokit infer` with --inference BuiltinEngine --inference.init_args.fast off",
                param,
            )

    def check_request(self, params, param: str) -> None:
        """`check`, and no top logprobs: the image path reports the sampled tokens' logprobs only."""
        self.check(param)
        if params.top_logprobs:
            raise RequestError("top logprobs are not reported for prompts with images: ask for 0", param)

    def processor(self):
        if self._processor is None:
            from grpokit.vision.render import load_processor

            self._processor = load_processor(self.path)
        return self._processor

    def render(self, messages: list[dict], template_kwargs: dict) -> tuple[list[int], VisionInputs]:
        """(prompt ids, image inputs) of chat messages with image parts, by the model's processor (on the
        engine thread); a RequestError (400) for an image it cannot use."""
        from grpokit.vision.render import render_prompt

        if template_kwargs:
            raise RequestError("chat_template_kwargs are not taken with images (the processor's template)", "messages")
        try:
            shaped, sources = split_images(messages)
            rendered = render_prompt(self.processor(), shaped, pictures(sources))
        except (ValueError, OSError, Image.DecompressionBombError) as e:  # ImageError, or the processor refusing one
            raise RequestError(f"the image parts cannot be used: {e}", "messages") from None
        return rendered.prompt_ids, rendered.vision

    def expand(self, template_ids: list[int], sources: list) -> tuple[list[int], VisionInputs, list[tuple[int, int]]]:
        """(prompt ids, image inputs, each image's placeholder range) of `/inference/v1/generate`'s ids before
        expansion and its `content_parts` sources, by the model's processor (on the engine thread); a
        RequestError (400) naming content_parts for an image it cannot use or placeholders that do not fit."""
        from grpokit.vision.render import expand_image_ids

        try:
            rendered, spans = expand_image_ids(self.processor(), template_ids, pictures(sources))
        except (ValueError, OSError, Image.DecompressionBombError) as e:
            raise RequestError(f"the content_parts cannot be used with these token_ids: {e}", "content_parts") from None
        return rendered.prompt_ids, rendered.vision, spans

    def inputs(self, text: str, param: str = "vision") -> VisionInputs:
        """A completions request's `vision` as VisionInputs, its tensors checked to be the model's image inputs."""
        self.check(param)
        try:
            vision = from_base64(text)
        except ValueError as e:
            raise RequestError(f"{param} must be grpokit.vision.inputs.to_base64's VisionInputs: {e}", param) from None
        if not vision or (unknown := sorted(set(vision.tensors) - self.input_names)):
            named = unknown if vision else "no tensors"
            raise RequestError(f"{param} holds {named}: the model takes image inputs {sorted(self.input_names)}", param)
        return vision

    @torch.no_grad()
    def generate(
        self, prompts: list[list[int]], vision: VisionInputs, n: int, sampling: SamplingSettings, options
    ) -> list[list[Completion]]:
        """n completions per prompt, each prompt with `vision` (module docstring: sampling)."""
        from grpokit.inference.image_rows import sample_image_group
        from grpokit.inference.streams import GroupRequest

        engine = self.engine
        generator = torch.Generator(device=engine.device).manual_seed(sampling.seed or 0)
        groups = []
        with self._weights():
            for i, prompt in enumerate(prompts):
                if options.is_cancelled():
                    groups.append([Completion.aborted(engine.weight_step) for _ in range(n)])
                    continue
                request = GroupRequest(None, prompt, n, vision=vision)
                try:
                    group = sample_image_group(engine, request, sampling, generator, options.cancelled)
                except ValueError as e:  # transformers: image features and image tokens do not match
                    raise RequestError(f"the image inputs do not fit the prompt: {e}", "vision") from None
                groups.append(group)
                self._report(options, group, i * n)
        return groups

    def _weights(self):
        """The engine's sampling weights (its merged LoRA copies when it has them), as its stream uses them."""
        engine = self.engine
        engine.prefix_cache.follow_weights(engine.model)
        merged = getattr(engine, "merged", None)
        return merged.active() if merged is not None else contextlib.nullcontext()

    @staticmethod
    def _report(options: ServingOptions, group: list[Completion], first: int) -> None:
        """A prompt's completions to a streamed answer, whole (a placeholder that ended a row was dropped)."""
        if options.on_tokens is not None:
            options.on_tokens([NewTokens(first + j, c.token_ids, c.logprobs) for j, c in enumerate(group)])


def pictures(sources: list) -> list[Image.Image]:
    """Image sources a client sent, as RGB images: `data:` URLs only (the server opens no file and fetches no
    URL for a client); an ImageError for any other source or an unreadable image."""
    if bad := [s for s in sources if not (isinstance(s, str) and s.startswith("data:"))]:
        raise ImageError(f"image {str(bad[0])[:60]!r} is not a data: URL (the server reads no files or URLs)")
    return [load_image(source) for source in sources]
