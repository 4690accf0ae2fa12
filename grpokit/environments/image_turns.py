"""Images in a later turn of a conversation: a `respond` message with image parts, rendered by the processor.

A task's `respond` may return messages whose content is a list of parts, text and images in the forms a
first prompt takes (grpokit.vision.messages: `image_url` with a data: URL or a path, `image` with a PIL
image, bytes, a path or a data: URL). The turn is rendered as ChatTokens renders a text turn (only the new
messages, after a probe chat, so earlier ids are never re-tokenised), but by the policy's processor, so
each image's placeholder tokens are expanded and its tensors made (grpokit.vision.render
.render_continuation). The conversation's image inputs grow by the turn's, in order
(grpokit.vision.inputs.with_turn): every later turn is sampled, and the trainer scores the whole
sequence, with all of them (the Qwen-VL family's 3-D positions recomputed over the whole sequence,
grpokit.vision.positions). The new tokens, images included, are the environment's: mask 0.

The images follow data.pixel_budget (resized or refused, and `max_images` counts the conversation's
images so far); an image that cannot be used stops the run naming the environment and example, as a
`respond` that raises does (the rollout cannot go on without its picture). A text-only policy is refused
at the first such turn, naming them. Tool results stay text (grpokit.environments.tools: a tool's answer
is a string or JSON).
"""

from __future__ import annotations

from typing import Any

from grpokit.environments.chat_tokens import PROBE_CHAT, ChatTokens
from grpokit.vision.images import ImageError, PixelBudget
from grpokit.vision.inputs import VisionInputs
from grpokit.vision.messages import prompt_images
from grpokit.vision.render import check_vision_model, load_processor, render_continuation


class ImageTurns:
    """Renders environment turns with images for one policy (its tokenizer's folder holds the processor),
    within `budget` (data.pixel_budget); the processor loads at the first such turn."""

    def __init__(self, tokenizer, budget: PixelBudget | None = None) -> None:
        self.tokenizer, self.budget = tokenizer, budget or PixelBudget()
        self._processor = None

    def processor(self, where: str):
        """The policy's processor, loaded at the first turn with images (a text-only policy is refused
        there), as grpokit.sft.render.ChatRenderer.processor does."""
        if self._processor is None:
            path = self.tokenizer.name_or_path
            check_vision_model(path, f"{where}: respond() returned a message with images; the conversation")
            self._processor = load_processor(path)
        return self._processor

    def render(
        self, where: str, chat: ChatTokens, completion_ids: list[int], messages: list[dict[str, Any]], held: int
    ) -> tuple[list[int], VisionInputs, int]:
        """(the ids that follow a finished completion: the rest of its closing, the `messages` with their
        images expanded, the next assistant header; the turn's image inputs; its number of images).
        `held`: images the conversation holds already; `where` names the environment and example."""
        processor = self.processor(where)
        shaped, images = prompt_images(messages, self.budget, where)
        limit = self.budget.max_images
        if limit is not None and held + len(images) > limit:
            raise ImageError(
                f"a later turn brings the conversation to {held + len(images)} images, more than the model takes "
                f"(data.pixel_budget.max_images {limit})",
                where,
            )
        try:
            rendered = render_continuation(processor, list(PROBE_CHAT), shaped, images)
        except (ValueError, OSError) as e:  # the processor refusing an image (too small, odd mode)
            raise ImageError(f"the processor cannot take a later turn's images: {e}", where) from e
        return chat.closing_after(completion_ids) + rendered.prompt_ids, rendered.vision, len(images)
