"""Images in a later turn of a conversation: a `respond` message or a tool's result with image parts,
rendered by the processor.

A task's `respond` may return messages whose content is a list of parts, text and images in the forms a
first prompt takes (grpokit.vision.messages: `image_url` with a data: URL or a path, `image` with a PIL
image, bytes, a path or a data: URL); a tool may return a picture (grpokit.environments.tool_images). The
turn is rendered as ChatTokens renders a text turn (only the new messages, after a probe chat, so earlier
ids are never re-tokenised), but by the policy's processor, so each image's placeholder tokens are expanded
and its tensors made (grpokit.vision.render.render_continuation). The conversation's image inputs grow by
the turn's, in order (grpokit.vision.inputs.with_turn): every later turn is sampled, and the trainer scores
the whole sequence, with all of them (the Qwen-VL family's 3-D positions recomputed over the whole
sequence, grpokit.vision.positions). The new tokens, images included, are the environment's: mask 0.
The turn also keeps its pictures and its ids before expansion (ImageSource), by which the conversation's
grows (Conversation.add_environment): vLLM renders pictures itself and is sent the whole conversation's
unexpanded ids with every picture so far (grpokit.inference.vllm.images).

The images follow data.pixel_budget (resized or refused, and `max_images` counts the conversation's
images so far); an image of `respond`'s that cannot be used stops the run naming the environment and
example, as a `respond` that raises does (the rollout cannot go on without its picture); a tool's is
checked before (tool_images.checked_pictures) and becomes the tool's error. A text-only policy is refused
at the first such turn, naming them. Where the processor's chat template cannot show a picture in a `tool`
message, a tool's pictures go in a `user` message right after its text (tool_images.pictures_after_tools).

`render_prompt` renders a whole first prompt with images, for a verifiers Env episode's role, whose
prompt the episode makes (grpokit.environments.episodes), as grpokit.orchestrator.image_prompts renders
the prompts the driver plays. `render_turn` is every later turn's one way in (text by the tokenizer's
template, pictures by `ImageTurns.render`): `respond`'s and tools' (grpokit.environments.multi_turn) and
the messages an Env episode's code sends with `turn()` (episodes.py: refused as TURN_PICTURE, naming the
role), so an episode's later pictures are rendered, budgeted and joined to the role's image inputs exactly
as the multi-turn loop's are.
"""

from __future__ import annotations

import logging
from typing import Any

from grpokit.environments.chat_tokens import PROBE_CHAT, ChatTokens
from grpokit.environments.tool_images import image_turn_source, pictures_after_tools, shows_tool_pictures
from grpokit.vision.images import ImageError, PixelBudget
from grpokit.vision.inputs import VisionInputs
from grpokit.vision.messages import check_image_count, has_images, prompt_images
from grpokit.vision.render import check_vision_model, load_processor, render_continuation, render_prompt

log = logging.getLogger(__name__)
TURN_PICTURE = "turn() sent a message with images"  # what brought an Env episode's later-turn pictures


class ImageTurns:
    """Renders environment turns (and episode roles' prompts) with images for one policy (its tokenizer's
    folder holds the processor), within `budget` (data.pixel_budget); the processor loads at the first one."""

    def __init__(self, tokenizer, budget: PixelBudget | None = None) -> None:
        self.tokenizer, self.budget = tokenizer, budget or PixelBudget()
        self._processor = None
        self.tool_pictures: bool | None = None  # whether the template shows a picture in a tool message

    def processor(self, where: str, source: str = "respond() returned a message with images"):
        """The policy's processor, loaded at the first turn with images (a text-only policy is refused
        there, naming `where` and the images' `source`), as grpokit.sft.render.ChatRenderer does."""
        if self._processor is None:
            path = self.tokenizer.name_or_path
            check_vision_model(path, f"{where}: {source}; the conversation")
            self._processor = load_processor(path)
        return self._processor

    def render(
        self, where: str, chat: ChatTokens, completion_ids: list[int], messages: list[dict], held: int, source: str = ""
    ) -> tuple[list[int], VisionInputs, int]:
        """(the ids that follow a finished completion: the rest of its closing, the `messages` with their
        images expanded, the next assistant header; the turn's image inputs; its number of images).
        `held`: images the conversation holds already; `where` names the environment and example; `source`:
        what brought the images, for a text-only policy's refusal (else told from the messages: `respond`, a
        tool). The turn's image inputs keep its pictures and its ids before expansion (ImageSource), for vLLM."""
        processor = self.processor(where, source or image_turn_source(messages))
        shaped, images = prompt_images(messages, self.budget, where)
        check_image_count(held + len(images), self.budget, where, "a later turn brings the conversation to ")
        try:
            shaped = self.for_template(processor, shaped)
            rendered = render_continuation(processor, list(PROBE_CHAT), shaped, images, keep_source=True)
        except (ValueError, OSError) as e:  # the processor refusing an image (too small, odd mode)
            raise ImageError(f"the processor cannot take a later turn's images: {e}", where) from e
        closing, source = chat.closing_after(completion_ids), rendered.vision.source
        source.template_ids, source.prompt_ids = closing + source.template_ids, closing + source.prompt_ids
        return closing + rendered.prompt_ids, rendered.vision, len(images)

    def render_prompt(self, where: str, messages: list[dict[str, Any]]) -> tuple[list[int], VisionInputs]:
        """(a first prompt's ids, its image inputs, with the ids before expansion for vLLM): `messages`
        rendered by the processor, the images within the budget; `where` names the environment and example."""
        processor = self.processor(where, "its prompt holds images")
        shaped, images = prompt_images(messages, self.budget, where)
        try:
            rendered = render_prompt(processor, shaped, images, keep_source=True)
        except (ValueError, OSError) as e:  # the processor refusing an image (too small, odd mode)
            raise ImageError(f"the processor cannot take its prompt's images: {e}", where) from e
        return rendered.prompt_ids, rendered.vision

    def for_template(self, processor, shaped: list[dict[str, Any]]) -> list[dict[str, Any]]:
        """`shaped` (processor-shaped messages) as the chat template can show them: a tool message's pictures
        in a user message after it where the template cannot show them in the tool message (asked once)."""
        if not any(m.get("role") == "tool" for m in shaped):
            return shaped
        if self.tool_pictures is None:
            self.tool_pictures = shows_tool_pictures(processor)
            if not self.tool_pictures:
                log.info(
                    "the chat template of %r does not show a picture in a tool message: a tool's pictures go in a "
                    "user message right after its result (docs/vision.md)",
                    self.tokenizer.name_or_path,
                )
        return shaped if self.tool_pictures else pictures_after_tools(shaped)


def render_turn(
    images: ImageTurns | None, where: str, chat: ChatTokens, ids: list[int], messages: list, held: int, source: str = ""
) -> tuple[list[int], VisionInputs | None, int]:
    """(an environment turn's ids after a finished completion's `ids`, its image inputs or None, its number
    of images): the tokenizer's template for text (ChatTokens.after_completion), the processor for messages with
    images (`images`: ImageTurns.render, `held` the images the conversation holds already). The one path of
    every later turn: `respond`'s and a tool's (grpokit.environments.multi_turn), an Env episode's `turn()`
    (grpokit.environments.episodes). `images` None: a caller that cannot render pictures, refused naming
    `where` and `source` (what brought them; else told from the messages)."""
    if not has_images(messages):
        return chat.after_completion(ids, messages), None, 0
    source = source or image_turn_source(messages)
    if images is None:
        raise ValueError(f"{where}: {source}, which this caller cannot render")
    return images.render(where, chat, ids, messages, held, source)
