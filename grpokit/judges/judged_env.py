"""The hook that adds a judge reward to an environment's rewards: `data.env[i].judge` in a recipe.

    data:
      env:
        - id: reverse-text
          judge: {kind: builtin, model: HuggingFaceTB/SmolLM2-135M-Instruct, weight: 0.5,
                  rubric: "The reply is the prompt's text reversed, nothing else.", on_failure: score}

A JudgedEnvironment is the environment with `checked_scores` extended: every scoring path of an
environment (a single-turn group, a multi-turn group's conversations, a verifiers Env episode's traces)
ends there with the group's verifiers traces, so the judge sees each rollout's whole conversation as the
trace lists it, and one call is one group: its conversations go to the judge as one batch. The reward is
the rubric's plus `weight` x the judge's [0, 1] score (the classifier's raw scalar), checked against
MAX_ABS_REWARD like any reward. Per-rollout metrics (env/ in metrics.csv, means over the step):
`reward/<name>` the judge's score, `judge/<name>/parse_failures`, `.../timeouts`, `.../down`,
`.../dropped` (0 or 1 each), `.../seconds` (the group's judge batch time, cache hits included); the
judge's reply (a classifier's score) is the rollout's note `judge/<name>/reply` in samples.jsonl.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from grpokit.common.errors import RunDataError
from grpokit.environments.environment import REWARD_METRIC_PREFIX, Environment, is_moderate
from grpokit.judges.cache import JudgeCache
from grpokit.judges.deferred import Deferred, deferred_here
from grpokit.judges.reward import Judged, JudgeReward, JudgeSettings

FAILURE_METRICS = {"parse": "parse_failures", "timeout": "timeouts", "down": "down", "nonfinite": "nonfinite"}


class JudgedEnvironment(Environment):
    """An environment whose rewards include a judge's: the loaded environment's examples and rubric,
    shared (not reloaded), with `judge` added in `checked_scores`."""

    def __init__(self, env: Environment, judge: JudgeReward) -> None:
        self.__dict__.update(env.__dict__)
        self.judge = judge

    def checked_scores(self, examples: list, traces: list, outcomes: list, *args, **kwargs) -> list:
        scored = super().checked_scores(examples, traces, outcomes, *args, **kwargs)
        conversations = [[m.model_dump(exclude_none=True) for m in tr.messages] for tr in traces]
        labels = [f"example {ex.index}" for ex in examples]
        deferred = deferred_here()
        if deferred is not None and self.judge.settings.concurrent:  # the rollout loop goes on meanwhile
            future = self.judge.queue.submit(conversations, labels)
            deferred.append(Deferred(future, lambda judged: self.with_judge(scored, judged, examples), len(scored)))
            return scored  # the rubric's part; grpokit.judges.deferred.complete puts the judge's in
        return self.with_judge(scored, self.judge.judge(conversations, labels), examples)

    def with_judge(self, scored: list, judged: list[Judged], examples: list) -> list[tuple[float, dict]]:
        """The group's (reward, metrics): the rubric's plus the judge's, after the failure policy."""
        labels = [f"example {ex.index}" for ex in examples]
        rewards, dropped = self.judge.settle(judged, labels, self.name)
        settings, out = self.judge.settings, []
        for (reward, metrics), judge_reward, j, ex in zip(scored, rewards, judged, examples):
            total = 0.0 if dropped else reward + settings.weight * judge_reward
            if not is_moderate(total):
                raise RunDataError(
                    f"environment {self.name!r} example {ex.index}: reward with judge {settings.name!r} is {total!r}; "
                    "scale the judge down (judge.weight)"
                )
            out.append((total, {**metrics, **judge_metrics(settings.name, judge_reward, j, dropped)}))
        return out


def judge_metrics(name: str, score: float, judged: Judged, dropped: bool) -> dict[str, float | str]:
    """One rollout's judge metrics (see the module docstring), and the judge's reply (a classifier's score,
    or the failure's error) as the str `judge/<name>/reply`, which the Rollout keeps as a note."""
    prefix = f"judge/{name}/"
    metrics: dict[str, float | str] = {f"{prefix}{m}": float(judged.failure == k) for k, m in FAILURE_METRICS.items()}
    metrics[f"{prefix}dropped"] = float(dropped)
    metrics[f"{prefix}seconds"] = judged.seconds
    metrics[f"{REWARD_METRIC_PREFIX}{name}"] = score
    metrics[f"{prefix}reply"] = judged.reply  # a str: the rollout's note for samples.jsonl (grpokit.types.Rollout)
    return metrics


def dropped_by_judge(rollouts: list) -> bool:
    """Whether a judge's failure dropped this group (`on_failure: drop_group`): the rollout loop leaves it
    out of the batch, as the buffer rules leave out a filtered group (prompts.jsonl: `judge_failed`)."""
    return any(
        value == 1.0 and key.startswith("judge/") and key.endswith("/dropped")
        for r in rollouts
        for key, value in r.metrics.items()
    )


def judged(env: Environment, cache: JudgeCache | None = None, merge: bool = False) -> Environment:
    """`env` with the judge its spec names (`judge`), or `env` itself when it names none. The judge's model
    loads at its first batch, so a bad setting fails here, at start, and a model only when used. `merge`:
    the judge's thread asks several groups' batches as one (grpokit.judges.queue; not in deterministic runs)."""
    value = getattr(env.spec, "judge", None)
    if value is None:
        return env
    settings = JudgeSettings.from_recipe(value, f"data.env {env.spec.id!r}")
    return JudgedEnvironment(env, JudgeReward(settings, cache, merge))


def attach_run(envs: list[Environment], run_dir: str | Path) -> None:
    """Keep the judges' replies of `envs` in the run folder (grpokit.judges.cache), reading what an
    earlier attempt of the run stored, so that a resumed run scores as the uninterrupted one did."""
    for env in envs:
        judge: Any = getattr(env, "judge", None)
        if judge is not None and judge.cache.path is None:
            judge.cache.attach(run_dir)
