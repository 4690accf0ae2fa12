"""exclaim: say something short about a topic; the reward comes from a judge, not from the environment.

A verifiers v1 taskset for the judge recipe (recipes/judge_exclaim.yaml, docs/judges.md): the prompts ask
for a short remark on a topic, and the taskset's own reward is 0 for every reply, so the rollout's reward
is exactly the judge's (`data.env[i].judge`). What the recipe's classifier judge prefers (a reply with an
exclamation mark: grpokit.envs.exclaim.train_judge) is checked independently by the rule-based metric
`exclaims` (1.0 when the reply contains "!"), logged as env/exclaims beside the judge's env/reward/<name>.

Args (recipe `data.env: [{id: exclaim, args: {...}}]`): num_tasks, seed.
"""

from __future__ import annotations

import random

import verifiers.v1 as vf

SYSTEM_PROMPT = "Reply with one short sentence."
TOPICS = (
    "the sea|a cat|coffee|winter|music|a garden|the moon|a bicycle|rain|a birthday|the mountains|a dog|"
    "pizza|the weekend|a library|the stars|snow|a train|chocolate|a football match|the summer|a concert|"
    "a forest|the city|a holiday|a puppy|sunrise|a rainbow|a robot|the beach"
).split("|")
ASKS = (
    "Say something about {}.", "Tell me something fun about {}.", "React to {} in one sentence.",
    "What do you think of {}?", "Give me a quick cheer for {}.", "Describe {} in one sentence.",
)  # fmt: skip


def exclaims(reply: str) -> float:
    """The rule the judge is checked against: 1.0 when the reply contains an exclamation mark."""
    return float("!" in reply)


class ExclaimTask(vf.Task[vf.TaskData]):
    @vf.reward(weight=0.0)
    async def none(self, trace: vf.Trace) -> float:
        """No reward of its own: the judge's score is the reward."""
        return 0.0

    @vf.metric
    async def exclaims(self, trace: vf.Trace) -> float:
        return exclaims(trace.last_reply or "")


class ExclaimConfig(vf.TasksetConfig):
    num_tasks: int = 1000
    seed: int = 0


class ExclaimTaskset(vf.Taskset[ExclaimTask, ExclaimConfig]):
    def load(self):
        rng = random.Random(self.config.seed)
        for i in range(self.config.num_tasks):
            prompt = rng.choice(ASKS).format(rng.choice(TOPICS))
            yield ExclaimTask(
                vf.TaskData(prompt=prompt, system_prompt=SYSTEM_PROMPT, id=f"exclaim-{i}"), self.config.task
            )


__all__ = ["ExclaimTaskset"]
