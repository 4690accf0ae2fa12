"""arithmetic: multi-step word problems with an integer answer, generated in code (seeded).

Each problem starts from a quantity ("Tom has 3 boxes of 12 apples") and applies operations (buys more,
gives some away, splits them equally, doubles) until it has taken the drawn number of steps; a step is
one arithmetic operation, so "3 boxes of 12" counts as one. Every intermediate total is a positive
integer. The reward is 1.0 when the reply's final answer equals the answer exactly, else 0.0; the final
answer is the last number inside the last \\boxed{...}, or the last number of the reply when there is no
\\boxed{}. A number with a non-zero fractional part is no integer answer ("42.0" counts as 42).

What scores: the prompt asks for "a single integer, alone or in \\boxed{}", and both score: "36" and
"\\boxed{36}". The format is not required: a number ending prose scores too ("so Tom has 36 apples."),
the fallback a model rambling past its first numbers learns from (recipes/arithmetic.yaml). Of several
numbers the last counts ("3 * 12 = 36" is read as 36, "36, or 40" as 40); a \\boxed{} wins over the
numbers after it ("\\boxed{36}, check: 40" is read as 36), and a \\boxed{} with no number in it is no
answer, whatever the prose says. A minus sign always belongs to the number ("40-4" holds 40 and -4).

Args (recipe `data.env: [{id: arithmetic, args: {...}}]`): num_tasks, min_steps, max_steps, max_number, seed.
"""

from __future__ import annotations

import random
import re
from fractions import Fraction

import verifiers.v1 as vf

SYSTEM_PROMPT = "Solve the word problem. Reply with the final answer as a single integer, alone or in \\boxed{}."

NAMES = ("Tom", "Ana", "Li", "Sara", "Omar", "Maya", "Ben", "Zoe", "Ravi", "Eva")
ITEMS = ("apples", "marbles", "stickers", "pencils", "cookies", "coins", "books", "stamps", "shells", "cards")
CONTAINERS = ("boxes", "bags", "jars", "packs", "crates")
MAX_GROUPS = 9  # "9 boxes of ..." at most: larger group counts read oddly

BOXED = re.compile(r"\\boxed\{([^{}]*)\}")
NUMBER = re.compile(r"-?[0-9]+(?:,[0-9]{3})*(?:\.[0-9]+)?")


def parse_answer(reply: str) -> int | None:
    """The last number of the last \\boxed{} (or of the reply without one), if it is an integer."""
    boxed = BOXED.findall(reply)
    numbers = NUMBER.findall(boxed[-1] if boxed else reply)
    if not numbers:
        return None
    value = Fraction(numbers[-1].replace(",", ""))
    return int(value) if value.denominator == 1 else None


def next_step(rng: random.Random, name: str, items: str, total: int, max_number: int) -> tuple[str, int]:
    """One operation applicable to `total`: its sentence and the new total (always a positive integer)."""
    options = ["buy"]
    if total >= 2:
        options.append("give")
    divisors = [k for k in range(2, min(max_number, total - 1) + 1) if total % k == 0]
    if divisors:
        options.append("split")
    if total <= 10 * max_number:  # keeps answers small enough for a small model to track
        options.append("double")
    match rng.choice(options):
        case "buy":
            k = rng.randint(1, max_number)
            return f"Then {name} buys {k} more.", total + k
        case "give":
            k = rng.randint(1, min(total - 1, max_number))
            return f"Then {name} gives away {k}.", total - k
        case "split":
            k = rng.choice(divisors)
            return f"Then {name} splits them equally into {k} piles and keeps one pile.", total // k
        case _:
            k = rng.choice((2, 3))
            return f"Then the number of {items} {name} has {('doubles', 'triples')[k - 2]}.", total * k


def make_problem(rng: random.Random, steps: int, max_number: int) -> tuple[str, int]:
    """A word problem of `steps` operations and its answer."""
    name, items = rng.choice(NAMES), rng.choice(ITEMS)
    if rng.random() < 0.5:
        groups, size = rng.randint(2, max(2, min(MAX_GROUPS, max_number))), rng.randint(2, max_number)
        sentences, total, done = (
            [f"{name} has {groups} {rng.choice(CONTAINERS)} of {size} {items} each."],
            groups * size,
            1,
        )
    else:
        total = rng.randint(1, max_number)
        sentences, done = [f"{name} has {total} {items}."], 0
    for _ in range(steps - done):
        sentence, total = next_step(rng, name, items, total, max_number)
        sentences.append(sentence)
    sentences.append(f"How many {items} does {name} have now?")
    return " ".join(sentences), total


def make_problems(num_tasks: int, min_steps: int, max_steps: int, max_number: int, seed: int) -> list[tuple[str, int]]:
    if not 1 <= min_steps <= max_steps:
        raise ValueError(
            f"arithmetic: need 1 <= min_steps <= max_steps, got min_steps={min_steps}, max_steps={max_steps}"
        )
    if max_number < 2:
        raise ValueError(f"arithmetic: max_number must be at least 2, got {max_number}")
    rng = random.Random(seed)
    return [make_problem(rng, rng.randint(min_steps, max_steps), max_number) for _ in range(num_tasks)]


class ArithmeticData(vf.TaskData):
    answer: int


class ArithmeticTask(vf.Task[ArithmeticData]):
    def parse_answer(self, reply: str) -> int | None:
        """The reply's answer, for `grpokit eval`'s majority vote (docs/evaluation.md)."""
        return parse_answer(reply)

    @vf.reward(weight=1.0)
    async def correct(self, trace: vf.Trace) -> float:
        return float(parse_answer(trace.last_reply or "") == self.data.answer)

    @vf.metric
    async def parsed(self, trace: vf.Trace) -> float:
        return float(parse_answer(trace.last_reply or "") is not None)


class ArithmeticConfig(vf.TasksetConfig):
    num_tasks: int = 2000
    min_steps: int = 2
    max_steps: int = 4
    max_number: int = 20
    seed: int = 0


class ArithmeticTaskset(vf.Taskset[ArithmeticTask, ArithmeticConfig]):
    def load(self):
        c = self.config
        for i, (question, answer) in enumerate(
            make_problems(c.num_tasks, c.min_steps, c.max_steps, c.max_number, c.seed)
        ):
            data = ArithmeticData(prompt=question, answer=answer, system_prompt=SYSTEM_PROMPT, id=f"arithmetic-{i}")
            yield ArithmeticTask(data, c.task)


__all__ = ["ArithmeticTaskset"]
