"""guess-number: a multi-turn game. The model guesses a secret whole number; after each wrong guess the
environment answers "Higher." or "Lower." (or asks for a number when the reply has none), until the
model finds it or runs out of turns.

Reward: 1.0 for finding the number on the first guess, 0.15 less for each further guess (so a model that
uses the hints and searches wins more), 0 when it never does; plus up to 0.2 for the last guess being
close (0.2 * (1 - |guess - secret| / (max_number - 1)), given only when not solved), so a game lost
narrowly still teaches. Per-turn rewards (for the `process` advantage): each turn's guess is rewarded
1 when right, else by how much it narrowed the interval the hints leave.

Args (recipe `data.env: [{id: guess-number, args: {...}}]`): num_tasks, max_number, max_turns, seed.
"""

from __future__ import annotations

import random
import re

import verifiers.v1 as vf

from grpokit.environments import EnvTurn

NUMBER = re.compile(r"-?\d+")
STEP_PENALTY = 0.15
CLOSENESS_WEIGHT = 0.2


def system_prompt(max_number: int) -> str:
    return (
        f"We play a game. I picked a whole number from 1 to {max_number}. Guess it. "
        "Reply with one number only. After a wrong guess I say Higher or Lower."
    )


def parse_guess(reply: str) -> int | None:
    """The first whole number of a reply, if any."""
    found = NUMBER.search(reply)
    return int(found.group()) if found else None


def guesses(trace: vf.Trace) -> list[int | None]:
    return [parse_guess(m.content or "") for m in trace.assistant_messages]


class GuessData(vf.TaskData):
    secret: int
    max_number: int


class GuessTask(vf.Task[GuessData]):
    """One game. `respond` answers each guess; the rubric scores the whole conversation."""

    max_turns = 5

    def respond(self, messages: list[dict], state: dict) -> EnvTurn:
        guess, secret = parse_guess(messages[-1]["content"]), self.data.secret
        low, high = state.setdefault("interval", [1, self.data.max_number])
        if guess is None:
            return EnvTurn([{"role": "user", "content": f"Reply with one number from 1 to {high}."}], reward=0.0)
        if guess == secret:
            return EnvTurn(done=True, reward=1.0)
        before = high - low + 1
        if guess < secret:
            state["interval"] = [max(low, guess + 1), high]
        else:
            state["interval"] = [low, min(high, guess - 1)]
        after = state["interval"][1] - state["interval"][0] + 1
        hint = "Higher." if guess < secret else "Lower."
        return EnvTurn([{"role": "user", "content": hint}], reward=(before - after) / max(before, 1))

    @vf.reward(weight=1.0)
    async def found(self, trace: vf.Trace) -> float:
        tries = guesses(trace)
        if self.data.secret in tries:
            return max(0.0, 1.0 - STEP_PENALTY * tries.index(self.data.secret))
        last = next((g for g in reversed(tries) if g is not None), None)
        if last is None:
            return 0.0
        distance = min(abs(last - self.data.secret), self.data.max_number - 1)
        return CLOSENESS_WEIGHT * (1 - distance / max(self.data.max_number - 1, 1))

    @vf.metric
    async def solved(self, trace: vf.Trace) -> float:
        return float(self.data.secret in guesses(trace))

    @vf.metric
    async def valid_guesses(self, trace: vf.Trace) -> float:
        tries = guesses(trace)
        return sum(g is not None and 1 <= g <= self.data.max_number for g in tries) / max(len(tries), 1)


class GuessConfig(vf.TasksetConfig):
    num_tasks: int = 1000
    max_number: int = 10
    max_turns: int = 5
    seed: int = 0


class GuessTaskset(vf.Taskset[GuessTask, GuessConfig]):
    def load(self):
        c = self.config
        if c.max_number < 2 or c.max_turns < 1:
            raise ValueError(
                f"guess-number: need max_number >= 2 and max_turns >= 1, got {c.max_number} and {c.max_turns}"
            )
        rng = random.Random(c.seed)
        for i in range(c.num_tasks):
            data = GuessData(
                prompt="Your first guess?",
                system_prompt=system_prompt(c.max_number),
                secret=rng.randint(1, c.max_number),
                max_number=c.max_number,
                id=f"guess-number-{i}",
            )
            task = GuessTask(data, c.task)
            task.max_turns = c.max_turns
            yield task


__all__ = ["GuessTaskset"]
