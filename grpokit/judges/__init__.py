"""Rewards from models: LLM judges and classifier reward models (docs/judges.md).

A recipe adds a judge reward to an environment with `data.env[i].judge` (grpokit.judges.judged_env);
the judge's prompt and the reading of its reply are grpokit.judges.template, where it runs is
grpokit.judges.backends (its own model in this process, or an OpenAI-compatible server) and
grpokit.judges.classifier (a sequence-classification reward model), the failure policy and metrics are
grpokit.judges.reward, and the run's cache of replies grpokit.judges.cache.
"""

from grpokit.judges.judged_env import JudgedEnvironment, attach_run, dropped_by_judge, judged
from grpokit.judges.reward import JudgeReward, JudgeSettings
from grpokit.judges.template import JudgeFormat, ParseFailure

__all__ = [
    "JudgeFormat", "JudgeReward", "JudgeSettings", "JudgedEnvironment", "ParseFailure", "attach_run",
    "dropped_by_judge", "judged",
]  # fmt: skip
