"""reverse-text: reverse a short phrase character by character.

A verifiers v1 taskset whose dataset is built in code (seeded), so it needs no dataset hub. The reward
is the LCS ratio 2 * LCS(reply, target) / (len(reply) + len(target)): dense (partial reversals earn
partial credit) and 1.0 only for the exact reversal.

Step rewards (for the `Process` advantage): each whitespace-separated word of the reply is a step,
rewarded with its LCS ratio to the answer's word at the same position (0 for words past the answer's).

Args (recipe `data.env: [{id: reverse-text, args: {...}}]`): num_tasks, min_words, max_words, seed.
"""

from __future__ import annotations

import random
import re

import verifiers.v1 as vf

SYSTEM_PROMPT = "Reverse the text character by character. Reply with the reversed text only."

WORDS = (
    "apple river stone cloud green music paper light house water dream tiger piano lemon robot "
    "happy quiet orange silver garden winter summer yellow planet rocket forest bridge candle "
    "window mirror pencil rabbit castle dragon flower little purple basket cookie monkey island "
    "marble ocean pillow shadow spring sugar table violin wagon zebra anchor banana cactus dolphin "
    "engine falcon guitar helmet jacket kettle ladder magnet needle oyster parrot rubber saddle "
    "tomato umbrella velvet walnut"
).split()


def lcs_length(a: str, b: str) -> int:
    """Length of the longest common subsequence of a and b (O(len(a) * len(b)) dynamic programme)."""
    prev = [0] * (len(b) + 1)
    for ca in a:
        cur = [0]
        for j, cb in enumerate(b):
            cur.append(prev[j] + 1 if ca == cb else max(prev[j + 1], cur[j]))
        prev = cur
    return prev[-1]


def lcs_ratio(reply: str, target: str) -> float:
    """2 * LCS / (len(reply) + len(target)); 1.0 when both are empty."""
    total = len(reply) + len(target)
    return 1.0 if total == 0 else 2.0 * lcs_length(reply, target) / total


def make_phrases(num_tasks: int, min_words: int, max_words: int, seed: int) -> list[str]:
    rng = random.Random(seed)
    return [" ".join(rng.choice(WORDS) for _ in range(rng.randint(min_words, max_words))) for _ in range(num_tasks)]


class ReverseTextData(vf.TaskData):
    answer: str


class ReverseTextTask(vf.Task[ReverseTextData]):
    def parse_answer(self, reply: str) -> str | None:
        """The stripped reply, for `grpokit eval`'s majority vote (replies that are the same text)."""
        return reply.strip() or None

    @vf.reward(weight=1.0)
    async def lcs(self, trace: vf.Trace) -> float:
        return lcs_ratio(trace.last_reply or "", self.data.answer)

    @vf.metric
    async def exact(self, trace: vf.Trace) -> float:
        return float((trace.last_reply or "") == self.data.answer)

    def step_rewards(self, reply: str) -> list[tuple[int, float]]:
        """(end character, reward) per word of the reply: its LCS ratio to the answer's word there."""
        targets = self.data.answer.split()
        return [
            (m.end(), lcs_ratio(m.group(), targets[i]) if i < len(targets) else 0.0)
            for i, m in enumerate(re.finditer(r"\S+", reply))
        ]


class ReverseTextConfig(vf.TasksetConfig):
    num_tasks: int = 2000
    min_words: int = 1
    max_words: int = 2
    seed: int = 0


class ReverseTextTaskset(vf.Taskset[ReverseTextTask, ReverseTextConfig]):
    def load(self):
        phrases = make_phrases(self.config.num_tasks, self.config.min_words, self.config.max_words, self.config.seed)
        for i, phrase in enumerate(phrases):
            data = ReverseTextData(
                prompt=phrase, answer=phrase[::-1], system_prompt=SYSTEM_PROMPT, id=f"reverse-text-{i}"
            )
            yield ReverseTextTask(data, self.config.task)


__all__ = ["ReverseTextTaskset"]
