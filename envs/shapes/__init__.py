"""shapes: answer a question about the shapes in a picture; prompts hold an image.

A verifiers v1 taskset whose pictures are drawn in code with PIL (seeded), so it needs no dataset: a
filled circle, square or triangle of one of six colours, at a random place and size, on a plain light
background; the questions ask its colour, its kind, which half of the picture it is in (left or right),
or how many shapes there are (one to three of the same kind and colour, smaller, not overlapping), each
in one word; "verify", whether it is of a colour, a kind or on a side the question names (yes or no,
true half the time); or, "describe", all three of its colour, kind and side at once: a structured summary.
Each prompt is a user message with the picture as an image part (a PNG `data:` URL, as an OpenAI-style
`image_url` content part) and the question; grpokit renders it with the model's processor
(grpokit.orchestrator.image_prompts), so the policy must be a vision-language model (docs/vision.md).
The reward is rule-based: 1.0 when the reply's first word is the answer (case and punctuation aside),
else 0.0. A "describe" reply earns a third for each of colour, kind and side that it names, alone among
that field's words ("red circle left" 1.0, "red circle" 2/3, "red or blue circle left" 2/3): partial
credit, so `grpokit eval --threshold 1` counts the replies with all three right. Each task's data also
holds the picture's `labels` (colour, kind, count, and side when the shape is wholly in one half), which
`grpokit pretrain-vision` learns from.

Args (recipe `data.env: [{id: shapes, args: {...}}]`): num_tasks, seed, size (the picture's width and
height in pixels), question ("colour", "shape", "position", "count", "verify", "describe"; "mixed": colour or
shape at random; "all": any of the four one-word questions at random; a list, e.g. [colour, position,
count]: any of those at random, so a question can be held out of a stage), tries (above 1: a multi-turn
game, a wrong answer is told "No, look again." and asked again, up to `tries` answers; the reward is the
last answer's, each turn's reward 1.0 when right; one-word questions only), verify_about (the fields
`verify` asks about, default [colour, kind, side]: [colour, side] holds kind out of a stage).
"""

from __future__ import annotations

import random
import re
from typing import Literal

import verifiers.v1 as vf
from PIL import Image, ImageDraw

from grpokit.environments import EnvTurn
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
MORE_QUESTIONS = {
    "position": "Is the shape on the left or on the right? Answer with one word.",
    "count": "How many shapes are there? Answer with one word.",
}
DESCRIBE = (
    "Describe the shape in three words: its colour, its kind (circle, square or triangle) "
    "and its side of the picture (left or right)."
)
COUNTS = ("one", "two", "three")
SIDES = ("left", "right")
Question = Literal["colour", "shape", "position", "count", "describe", "verify"]


def draw_shape(shape: str, colour: str, size: int, rng: random.Random) -> Image.Image:
    """A `size` x `size` picture of one filled `shape` of `colour`, at least a third of the picture wide."""
    image = Image.new("RGB", (size, size), BACKGROUND)
    side = rng.randint(max(size // 3, 4), max(size * 3 // 4, 5))
    x, y = rng.randint(0, size - side), rng.randint(0, size - side)
    shape_at(ImageDraw.Draw(image), shape, (x, y, x + side - 1, y + side - 1), COLOURS[colour])
    return image


def shape_at(draw: ImageDraw.ImageDraw, shape: str, box: tuple[int, int, int, int], fill) -> None:
    """`shape` filled with `fill` in the square `box` (x0, y0, x1, y1; both ends inside)."""
    x0, y0, x1, y1 = box
    if shape == "circle":
        draw.ellipse(box, fill=fill)
    elif shape == "square":
        draw.rectangle(box, fill=fill)
    else:
        draw.polygon([(x0 + (x1 - x0 + 1) // 2, y0), (x0, y1), (x1, y1)], fill=fill)


def draw_beside(shape: str, colour: str, size: int, rng: random.Random) -> tuple[Image.Image, str]:
    """A picture of one `shape` wholly in the left or the right half (which one, returned, at random)."""
    image = Image.new("RGB", (size, size), BACKGROUND)
    half = size // 2
    side = rng.randint(max(size // 4, 4), max(half - 2, 5))
    where = rng.choice(["left", "right"])
    x = rng.randint(0, half - side) + (0 if where == "left" else size - half)
    y = rng.randint(0, size - side)
    shape_at(ImageDraw.Draw(image), shape, (x, y, x + side - 1, y + side - 1), COLOURS[colour])
    return image, where


def draw_several(shape: str, colour: str, size: int, rng: random.Random) -> tuple[Image.Image, str]:
    """A picture of one to three `shape`s (how many, returned as a word) that neither overlap nor touch."""
    image = Image.new("RGB", (size, size), BACKGROUND)
    draw, count, boxes = ImageDraw.Draw(image), rng.randint(1, 3), []
    side = max(size // 5, 4)
    while len(boxes) < count:
        x, y = rng.randint(0, size - side), rng.randint(0, size - side)
        box = (x, y, x + side - 1, y + side - 1)
        if all(x > b[2] + 2 or b[0] > box[2] + 2 or y > b[3] + 2 or b[1] > box[3] + 2 for b in boxes):
            boxes.append(box)
            shape_at(draw, shape, box, COLOURS[colour])
    return image, COUNTS[count - 1]


def first_word(reply: str) -> str:
    """The reply's first word, lower-cased, without punctuation ("" for a reply without one)."""
    match = re.search(r"[a-z]+", reply.lower())
    return match.group() if match else ""


class ShapesData(vf.TaskData):
    answer: str
    shape: str
    colour: str
    labels: dict[str, str]  # what the picture shows (colour, kind, count, side): `grpokit pretrain-vision`'s target


class ShapesTask(vf.Task[ShapesData]):
    def parse_answer(self, reply: str) -> str | None:
        """The reply's first word, for `grpokit eval`'s majority vote."""
        return first_word(reply) or None

    @vf.reward(weight=1.0)
    async def correct(self, trace: vf.Trace) -> float:
        return float(first_word(trace.last_reply or "") == self.data.answer)


def fields_named(reply: str, labels: dict[str, str]) -> float:
    """The share of colour, kind and side that `reply` names right: a field counts when the reply's words
    from that field's vocabulary are exactly its label (so naming every colour earns nothing for colour)."""
    words = set(re.findall(r"[a-z]+", reply.lower()))
    fields = {"colour": set(COLOURS), "kind": set(SHAPES), "side": set(SIDES)}
    return sum(words & vocabulary == {labels[field]} for field, vocabulary in fields.items()) / len(fields)


class ShapesDescribeTask(ShapesTask):
    """ "describe": the reply names the shape's colour, kind and side; a third of the reward for each."""

    def parse_answer(self, reply: str) -> str | None:
        """The colour, kind and side words the reply names, in that order, for `grpokit eval`'s majority vote."""
        words = re.findall(r"[a-z]+", reply.lower())
        named = [w for vocabulary in (COLOURS, SHAPES, SIDES) for w in words if w in vocabulary]
        return " ".join(named) or None

    @vf.reward(weight=1.0)
    async def correct(self, trace: vf.Trace) -> float:
        return fields_named(trace.last_reply or "", self.data.labels)


class ShapesRetryTask(ShapesTask):
    """The same question, with up to `max_turns` answers: a wrong one is told so, and the picture stays
    in the conversation (its first message)."""

    max_turns = 2

    def respond(self, messages: list[dict], state: dict) -> EnvTurn:
        if first_word(messages[-1]["content"] or "") == self.data.answer:
            return EnvTurn(done=True, reward=1.0)
        return EnvTurn([{"role": "user", "content": "No, look again."}], reward=0.0)


def ask_one(question: str | list[str], rng: random.Random) -> str:
    """The question a task asks: `question` itself, or one drawn from "mixed", "all" or a list."""
    if isinstance(question, list):
        if not question:
            raise ValueError(
                "shapes: question [] names no question; list some of colour, shape, position, count, describe"
            )
        return rng.choice(sorted(set(question)))
    if question in ("mixed", "all"):
        return rng.choice(sorted(QUESTIONS) if question == "mixed" else sorted({**QUESTIONS, **MORE_QUESTIONS}))
    return question


def draw_for(asks: str, shape: str, colour: str, size: int, rng: random.Random) -> tuple[Image.Image, str, dict]:
    """The picture for question `asks`, its answer, and its labels (what it shows)."""
    labels = {"colour": colour, "kind": shape, "count": "one"}
    if asks in ("position", "describe", "verify"):
        image, labels["side"] = draw_beside(shape, colour, size, rng)
        return image, labels["side"] if asks == "position" else f"{colour} {shape} {labels['side']}", labels
    if asks == "count":
        image, labels["count"] = draw_several(shape, colour, size, rng)
        return image, labels["count"], labels
    return draw_shape(shape, colour, size, rng), colour if asks == "colour" else shape, labels


def verify_question(labels: dict[str, str], about: list[str], rng: random.Random) -> tuple[str, str]:
    """A yes-or-no question about one of the picture's `about` fields (colour, kind, side; which, at random),
    naming its label or another value with even odds, and its answer: "Is the shape red?" -> "yes" for a
    red shape."""
    field = rng.choice(sorted(set(about)))
    values = {"colour": sorted(COLOURS), "kind": list(SHAPES), "side": list(SIDES)}[field]
    true = rng.random() < 0.5
    named = labels[field] if true else rng.choice([v for v in values if v != labels[field]])
    text = {
        "colour": f"Is the shape {named}?",
        "kind": f"Is the shape a {named}?",
        "side": f"Is the shape on the {named}?",
    }
    return f"{text[field]} Answer yes or no.", "yes" if true else "no"


class ShapesConfig(vf.TasksetConfig):
    num_tasks: int = 1000
    seed: int = 0
    size: int = 56
    question: Question | Literal["mixed", "all"] | list[Question] = "colour"
    tries: int = 1
    verify_about: list[Literal["colour", "kind", "side"]] = ["colour", "kind", "side"]


class ShapesTaskset(vf.Taskset[ShapesTask, ShapesConfig]):
    def load(self):
        config = self.config
        rng = random.Random(config.seed)
        for i in range(config.num_tasks):
            shape, colour = rng.choice(SHAPES), rng.choice(sorted(COLOURS))
            asks = ask_one(config.question, rng)
            image, answer, labels = draw_for(asks, shape, colour, config.size, rng)
            text = {**QUESTIONS, **MORE_QUESTIONS, "describe": DESCRIBE}.get(asks)
            if asks == "verify":
                text, answer = verify_question(labels, config.verify_about, rng)
            content = [{"type": "image_url", "image_url": {"url": to_data_url(image)}}, {"type": "text", "text": text}]
            data = ShapesData(
                prompt=[{"role": "user", "content": content}],
                answer=answer,
                shape=shape,
                colour=colour,
                labels=labels,
                id=f"shapes-{i}",
            )
            if config.tries <= 1:
                yield (ShapesDescribeTask if asks == "describe" else ShapesTask)(data, config.task)
                continue
            if asks == "describe":
                raise ValueError("shapes: tries > 1 takes one-word questions; drop describe or set tries: 1")
            task = ShapesRetryTask(data, config.task)
            task.max_turns = config.tries
            yield task


__all__ = ["ShapesTaskset"]
