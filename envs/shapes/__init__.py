"""shapes: say the colour (or the kind) of the shape in a picture; prompts hold an image.

A verifiers v1 taskset whose pictures are drawn in code with PIL (seeded), so it needs no dataset: a
filled circle, square or triangle of one of six colours, at a random place and size, on a plain light
background. Each prompt is a user message with the picture as an image part (a PNG `data:` URL, as an
OpenAI-style `image_url` content part) and the question; grpokit renders it with the model's processor
(grpokit.orchestrator.image_prompts), so the policy must be a vision-language model (docs/vision.md).
The reward is rule-based: 1.0 when the reply's first word is the answer (case and punctuation aside),
else 0.0.

Args (recipe `data.env: [{id: shapes, args: {...}}]`): num_tasks, seed, size (the picture's width and
height in pixels), question ("colour", "shape" or "mixed": each prompt asks one of the two at random).
"""

from __future__ import annotations

import random
import re
from typing import Literal

import verifiers.v1 as vf
from PIL import Image, ImageDraw

from grpokit.vision.images import to_data_url

COLOURS = {
    "red": (220, 30, 30),
    "green": (30, 170, 60),
    "blue": (30, 70, 220),
    "yellow": (235, 205, 20),
    "purple": (140, 40, 170),
    "orange": (245, 130, 20),
}
SHAPES = ("circle", "square", "triangle")
BACKGROUND = (245, 245, 240)
QUESTIONS = {
    "colour": "What colour is the shape? Answer with one word.",
    "shape": "Which shape is this: circle, square or triangle? Answer with one word.",
}


def draw_shape(shape: str, colour: str, size: int, rng: random.Random) -> Image.Image:
    """A `size` x `size` picture of one filled `shape` of `colour`, at least a third of the picture wide."""
    image = Image.new("RGB", (size, size), BACKGROUND)
    side = rng.randint(max(size // 3, 4), max(size * 3 // 4, 5))
    x, y = rng.randint(0, size - side), rng.randint(0, size - side)
    box = (x, y, x + side - 1, y + side - 1)
    fill = COLOURS[colour]
    draw = ImageDraw.Draw(image)
    if shape == "circle":
        draw.ellipse(box, fill=fill)
    elif shape == "square":
        draw.rectangle(box, fill=fill)
    else:
        draw.polygon([(x + side // 2, y), (x, y + side - 1), (x + side - 1, y + side - 1)], fill=fill)
    return image


def first_word(reply: str) -> str:
    """The reply's first word, lower-cased, without punctuation ("" for a reply without one)."""
    match = re.search(r"[a-z]+", reply.lower())
    return match.group() if match else ""


class ShapesData(vf.TaskData):
    answer: str
    shape: str
    colour: str


class ShapesTask(vf.Task[ShapesData]):
    def parse_answer(self, reply: str) -> str | None:
        """The reply's first word, for `grpokit eval`'s majority vote."""
        return first_word(reply) or None

    @vf.reward(weight=1.0)
    async def correct(self, trace: vf.Trace) -> float:
        return float(first_word(trace.last_reply or "") == self.data.answer)


class ShapesConfig(vf.TasksetConfig):
    num_tasks: int = 1000
    seed: int = 0
    size: int = 56
    question: Literal["colour", "shape", "mixed"] = "colour"


class ShapesTaskset(vf.Taskset[ShapesTask, ShapesConfig]):
    def load(self):
        config = self.config
        rng = random.Random(config.seed)
        for i in range(config.num_tasks):
            shape, colour = rng.choice(SHAPES), rng.choice(sorted(COLOURS))
            image = draw_shape(shape, colour, config.size, rng)
            asks = config.question if config.question != "mixed" else rng.choice(sorted(QUESTIONS))
            content = [
                {"type": "image_url", "image_url": {"url": to_data_url(image)}},
                {"type": "text", "text": QUESTIONS[asks]},
            ]
            data = ShapesData(
                prompt=[{"role": "user", "content": content}],
                answer=colour if asks == "colour" else shape,
                shape=shape,
                colour=colour,
                id=f"shapes-{i}",
            )
            yield ShapesTask(data, config.task)


__all__ = ["ShapesTaskset"]
