"""calculator: multi-digit arithmetic with a calculator tool.

The question is one product or sum of multi-digit numbers ("What is 347 * 29?"), which SmolLM2-135M gets
wrong on its own. The model may call the tool `calculator(expression)` in the Hermes syntax
(grpokit.environments.tools); the result comes back as a tool message, and the model then answers.

Reward: 1.0 when the final reply's last number is the answer, else 0; plus 0.2 when a tool call
returned a result, so a model that has not yet learnt to answer from the result is still pulled
toward calling the tool. What scores: the prompt asks for "the number only", and no format is required:
the final reply's last number is its answer, whether it stands alone ("10063"), ends prose ("347 * 29 is
10,063.") or follows others ("347 * 29 = 10063": the last counts). A number is read as
envs/dataset/answers.py reads one (comma groups of three, a decimal part, a minus sign unless it follows
a digit: "10-3" holds 10 and 3); a value with a fractional part is no whole-number answer, so "12.5"
does not count as 5 and "10063.0" counts as 10063.

Metrics: `solved` (the answer is right), `tool_success` (a call returned a result), `used_tool` (a call
was made at all). The prompt holds three worked exchanges (see EXAMPLE).

Args (recipe `data.env: [{id: calculator, args: {...}}]`): num_tasks, min_digits, max_digits, seed.
"""

from __future__ import annotations

import ast
import json
import operator
import random

import verifiers.v1 as vf

from grpokit.envs.dataset import answers

TOOL_BONUS = 0.2
SYSTEM_PROMPT = "You have a calculator tool. Call it for every question, then reply with the number only."


def _call(expression: str) -> str:
    """A calculator call in SmolLM2's function-calling format: a JSON list in one <tool_call> block."""
    return f"<tool_call>[{json.dumps({'name': 'calculator', 'arguments': {'expression': expression}})}]</tool_call>"


# Three worked exchanges before the question. A 135M model copies a format it has seen in the chat far
# more often than one it is told about: measured on SmolLM2-135M-Instruct, 32 first replies each
# (temperature 1): a system prompt alone, or with SmolLM2's own function-calling prompt and one example,
# gave 0-1 valid calls; three examples gave 22 (20 with the plain Hermes object instead of a list).
SHOTS = (("12 * 34", 408), ("305 + 78", 383), ("41 * 7", 287))
EXAMPLE = [
    message
    for expression, result in SHOTS
    for message in (
        vf.UserMessage(content=f"What is {expression}?"),
        vf.AssistantMessage(content=_call(expression)),
        vf.ToolMessage(content=str(result), tool_call_id=f"call_{expression}"),
        vf.AssistantMessage(content=str(result)),
    )
]
OPERATORS = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul, ast.USub: operator.neg}
MAX_EXPRESSION = 200


def calculator(expression: str) -> str:
    """Evaluate an arithmetic expression of whole numbers with +, - and *.

    Args:
        expression: the expression, e.g. "347 * 29".
    """
    if len(expression) > MAX_EXPRESSION:
        raise ValueError(f"the expression is longer than {MAX_EXPRESSION} characters")
    return str(_evaluate(ast.parse(expression.replace("×", "*"), mode="eval").body))


def _evaluate(node: ast.AST) -> int:
    """Whole-number arithmetic only: no names, calls or powers (nothing a model could abuse)."""
    if isinstance(node, ast.Constant) and isinstance(node.value, int) and not isinstance(node.value, bool):
        return node.value
    if isinstance(node, ast.BinOp) and type(node.op) in OPERATORS:
        left, right = _evaluate(node.left), _evaluate(node.right)
        if abs(left) > 10**12 or abs(right) > 10**12:
            raise ValueError("numbers above 10^12 are not supported")
        return OPERATORS[type(node.op)](left, right)
    if isinstance(node, ast.UnaryOp) and type(node.op) in OPERATORS:
        return OPERATORS[type(node.op)](_evaluate(node.operand))
    raise ValueError("only whole numbers with +, - and * are supported")


def final_answer(reply: str) -> int | None:
    """The reply's last number if it is a whole number; None when there is none or it has a fraction."""
    found = answers.numbers(reply)
    return int(found[-1]) if found and found[-1].denominator == 1 else None


class CalculatorData(vf.TaskData):
    answer: int


class CalculatorTask(vf.Task[CalculatorData]):
    """One question; `tools` makes grpokit run it as a multi-turn rollout (grpokit.environments.conversation)."""

    tools = (calculator,)
    max_turns = 3

    def parse_answer(self, reply: str) -> int | None:
        """The final reply's answer, for `grpokit eval`'s majority vote (docs/evaluation.md)."""
        return final_answer(reply)

    @vf.reward(weight=1.0)
    async def correct(self, trace: vf.Trace) -> float:
        return float(final_answer(trace.last_reply or "") == self.data.answer)

    @vf.reward(weight=TOOL_BONUS)
    async def tool_ok(self, trace: vf.Trace) -> float:
        return float(any(not (m.content or "").startswith("Error") for m in tool_results(trace)))

    @vf.metric
    async def used_tool(self, trace: vf.Trace) -> float:
        return float(bool(tool_results(trace)))

    @vf.metric
    async def tool_success(self, trace: vf.Trace) -> float:
        """A call returned a result (not an error): the tool-call success rate."""
        return await self.tool_ok(trace)

    @vf.metric
    async def solved(self, trace: vf.Trace) -> float:
        return await self.correct(trace)


def tool_results(trace: vf.Trace) -> list:
    """The tool messages answering this question (after the last user message, so not the example's)."""
    messages = trace.messages
    last_user = max((i for i, m in enumerate(messages) if m.role == "user"), default=-1)
    return [m for m in messages[last_user + 1 :] if m.role == "tool"]


def make_question(rng: random.Random, min_digits: int, max_digits: int) -> tuple[str, int]:
    def number() -> int:
        digits = rng.randint(min_digits, max_digits)
        return rng.randint(10 ** (digits - 1), 10**digits - 1)

    a, b = number(), number()
    if rng.random() < 0.5:
        return f"What is {a} * {b}?", a * b
    return f"What is {a} + {b}?", a + b


class CalculatorConfig(vf.TasksetConfig):
    num_tasks: int = 1000
    min_digits: int = 2
    max_digits: int = 3
    seed: int = 0


class CalculatorTaskset(vf.Taskset[CalculatorTask, CalculatorConfig]):
    def load(self):
        c = self.config
        if not 1 <= c.min_digits <= c.max_digits <= 6:
            raise ValueError(f"calculator: need 1 <= min_digits <= max_digits <= 6, got {c.min_digits}, {c.max_digits}")
        rng = random.Random(c.seed)
        for i in range(c.num_tasks):
            question, answer = make_question(rng, c.min_digits, c.max_digits)
            data = CalculatorData(
                prompt=[*EXAMPLE, vf.UserMessage(content=question)],
                answer=answer,
                system_prompt=SYSTEM_PROMPT,
                id=f"calculator-{i}",
            )
            yield CalculatorTask(data, c.task)


__all__ = ["CalculatorTaskset"]
