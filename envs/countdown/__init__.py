"""countdown: reach a target with + - * / over 3-4 given numbers, each used at most once (TinyZero's task).

Puzzles are generated in code (seeded): draw the numbers, combine them in a random order with random
operators into one expression whose every intermediate value is a positive integer, and keep it when its
value lies in [1, max_target] and is not one of the numbers. So every puzzle is solvable using each
number exactly once. Departures from TinyZero: a reply may leave numbers unused (TinyZero requires each
exactly once), and a reply without <answer> tags is read from its last line.

Scoring never runs model output: the expression (the last <answer>...</answer>, else the reply's last
non-empty line; anything from the first "=" on is dropped, so "3 * 4 = 12" reads as "3 * 4") may contain
only ASCII digits, + - * / ( ) and whitespace; it is parsed with `ast` and only integer literals and the four
binary operators are evaluated, in exact fractions. Reward, as in TinyZero: 1.0 when the value equals the
target (within 1e-6); `format_score` (0.1) when the expression is well formed, combines offered numbers
with at least one operator (a bare number is no answer), uses each at most as often as offered, and has a
value (no division by zero); else 0.0. Metric `solved`: 1.0 iff it equals
the target.

What scores: an expression, never a number. The prompt asks for it in <answer></answer> tags; without
tags, the reply's last non-empty line is read, and counts only when it is nothing but an expression
("4 + 7", or "4 + 7 = 11"), so prose around an answer ("I get 4 + 7 = 11.") scores 0 unless the
expression is tagged or alone on the last line. A bare number scores 0 in tags or not, the target
included ("<answer>11</answer>": no operator, so no answer, and no format credit). Of several tagged
answers the last counts; of several expressions on the last line, the text before its first "=".

Args (recipe `data.env: [{id: countdown, args: {...}}]`): num_tasks, min_numbers, max_numbers,
max_number, max_target, seed; and `task: {format_score: ...}` (0.0 for a pure correctness reward).
"""

from __future__ import annotations

import ast
import operator
import random
import re
from collections import Counter
from fractions import Fraction

import verifiers.v1 as vf

SYSTEM_PROMPT = "Solve the arithmetic puzzle. Give the final expression inside <answer></answer> tags."

ANSWER = re.compile(r"<answer>(.*?)</answer>", re.DOTALL)
ALLOWED_CHARS = re.compile(r"[0-9+\-*/()\s]+", re.ASCII)
MAX_EXPRESSION_CHARS = 200  # bounds parsing work; a 4-number expression needs far fewer
OPERATORS = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul, ast.Div: operator.truediv}
MAX_ATTEMPTS = 10_000


def random_expression(rng: random.Random, numbers: list[int]) -> tuple[int, str]:
    """Combine all `numbers` in random order with random operators; every intermediate is a positive integer."""
    items = [(n, str(n)) for n in numbers]
    while len(items) > 1:
        (a, ea), (b, eb) = items.pop(rng.randrange(len(items))), items.pop(rng.randrange(len(items)))
        if a < b:
            (a, ea), (b, eb) = (b, eb), (a, ea)
        ops = ["+", "*"] + ["-"] * (a > b) + ["/"] * (b > 1 and a % b == 0)
        op = rng.choice(ops)
        value = {"+": a + b, "-": a - b, "*": a * b, "/": a // b}[op]
        items.append((value, f"({ea} {op} {eb})"))
    value, expression = items[0]
    return value, expression[1:-1] if len(numbers) > 1 else expression


def make_puzzle(rng: random.Random, count: int, max_number: int, max_target: int) -> tuple[list[int], int, str]:
    """`count` numbers in [1, max_number], a target in [1, max_target] and an expression that reaches it."""
    for _ in range(MAX_ATTEMPTS):
        numbers = [rng.randint(1, max_number) for _ in range(count)]
        target, expression = random_expression(rng, numbers)
        if 1 <= target <= max_target and target not in numbers:
            return numbers, target, expression
    raise ValueError(
        f"countdown: no puzzle of {count} numbers up to {max_number} "
        f"reaches a target in [1, {max_target}]; raise max_target"
    )


def make_puzzles(
    num_tasks: int, min_numbers: int, max_numbers: int, max_number: int, max_target: int, seed: int
) -> list[tuple[list[int], int, str]]:
    if not 2 <= min_numbers <= max_numbers:
        raise ValueError(f"countdown: need 2 <= min_numbers <= max_numbers, got {min_numbers}, {max_numbers}")
    if max_number < 1 or max_target < 1:
        raise ValueError(f"countdown: max_number and max_target must be positive, got {max_number}, {max_target}")
    rng = random.Random(seed)
    return [make_puzzle(rng, rng.randint(min_numbers, max_numbers), max_number, max_target) for _ in range(num_tasks)]


def extract_expression(reply: str) -> str:
    """The last <answer>...</answer>, else the last non-empty line; cut at the first "="."""
    answers = ANSWER.findall(reply)
    lines = [line for line in reply.splitlines() if line.strip()]
    text = answers[-1] if answers else (lines[-1] if lines else "")
    return text.split("=")[0].strip()


def evaluate(expression: str, numbers: list[int]) -> Fraction | None:
    """The exact value of `expression`, or None when it is malformed, uses a number not offered (or more
    often than offered), divides by zero, or is a bare number (no operator). Only integer literals and
    + - * / are ever evaluated.

    A bare number gets no format credit: it only repeats one of the puzzle's inputs (never the target),
    and SmolLM2-135M learned within 15 steps to answer every puzzle with one offered number for a
    steady 0.1 (docs/results.md)."""
    if not expression or len(expression) > MAX_EXPRESSION_CHARS or not ALLOWED_CHARS.fullmatch(expression):
        return None
    try:
        tree = ast.parse(expression, mode="eval")
    except (SyntaxError, ValueError, RecursionError, MemoryError):
        return None
    allowed = (ast.Expression, ast.BinOp, ast.Constant, *OPERATORS)
    nodes = list(ast.walk(tree))
    if not all(isinstance(node, allowed) for node in nodes) or not isinstance(tree.body, ast.BinOp):
        return None
    literals = [node.value for node in nodes if isinstance(node, ast.Constant)]
    if any(type(v) is not int for v in literals) or Counter(literals) - Counter(numbers):
        return None
    try:
        return value(tree.body)
    except (ZeroDivisionError, RecursionError):
        return None


def value(node: ast.expr) -> Fraction:
    """Evaluate a tree `evaluate` has already checked holds only int constants and + - * / nodes."""
    if isinstance(node, ast.Constant):
        return Fraction(node.value)
    return OPERATORS[type(node.op)](value(node.left), value(node.right))


def solves(result: Fraction | None, target: int) -> bool:
    return result is not None and abs(result - target) <= 1e-6


class CountdownData(vf.TaskData):
    numbers: list[int]
    target: int
    solution: str  # one expression reaching the target (not shown to the model)


class CountdownTaskConfig(vf.TaskConfig):
    format_score: float = 0.1


class CountdownTask(vf.Task[CountdownData, vf.State, CountdownTaskConfig]):
    def parse_answer(self, reply: str) -> Fraction | None:
        """The value of the reply's expression (None when it is not a valid one), for `grpokit eval`'s
        majority vote: two expressions that reach the same value vote together."""
        return evaluate(extract_expression(reply), self.data.numbers)

    @vf.reward(weight=1.0)
    async def countdown(self, trace: vf.Trace) -> float:
        result = evaluate(extract_expression(trace.last_reply or ""), self.data.numbers)
        if solves(result, self.data.target):
            return 1.0
        return self.config.format_score if result is not None else 0.0

    @vf.metric
    async def solved(self, trace: vf.Trace) -> float:
        return float(solves(evaluate(extract_expression(trace.last_reply or ""), self.data.numbers), self.data.target))


class CountdownConfig(vf.TasksetConfig):
    task: CountdownTaskConfig = CountdownTaskConfig()
    num_tasks: int = 2000
    min_numbers: int = 3
    max_numbers: int = 4
    max_number: int = 99
    max_target: int = 100
    seed: int = 0


def prompt(numbers: list[int], target: int) -> str:
    return (
        f"Using the numbers {numbers}, create an expression that equals {target}. You may use + - * / and "
        "parentheses, and each number at most once. Put the expression in <answer></answer> tags, "
        "for example <answer>(1 + 2) / 3</answer>."
    )


class CountdownTaskset(vf.Taskset[CountdownTask, CountdownConfig]):
    def load(self):
        c = self.config
        puzzles = make_puzzles(c.num_tasks, c.min_numbers, c.max_numbers, c.max_number, c.max_target, c.seed)
        for i, (numbers, target, solution) in enumerate(puzzles):
            data = CountdownData(
                prompt=prompt(numbers, target),
                numbers=numbers,
                target=target,
                solution=solution,
                system_prompt=SYSTEM_PROMPT,
                id=f"countdown-{i}",
            )
            yield CountdownTask(data, c.task)


__all__ = ["CountdownTaskset"]
